import sys

from popmq.cli import main

sys.exit(main())
