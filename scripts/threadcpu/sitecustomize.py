"""With TNAMES_DIR set: write this process's Python thread names by native thread id to
``TNAMES_DIR/<pid>.json`` every half second (for threadcpu.py)."""

import json
import os
import sys
import threading
import time

_D = os.environ.get("TNAMES_DIR")
if _D:
    names = {}

    def _dump():
        while True:
            time.sleep(0.5)
            for t in threading.enumerate():
                if t.native_id is not None:
                    names[t.native_id] = t.name
            with open(os.path.join(_D, f"{os.getpid()}.json"), "w") as f:
                json.dump({"argv": sys.argv, "names": names}, f)

    threading.Thread(target=_dump, daemon=True, name="tnames").start()
