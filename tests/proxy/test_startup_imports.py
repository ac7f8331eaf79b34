"""What `popmq proxy` imports at start-up: every module is resident memory of each proxy
process before it serves one call (docs/benchmarks.md, "Idle polls (wave 7)"), so the parts
only brokers, the console, benches or etcd need stay out."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess  # a fresh interpreter: this one has imported everything

# Module prefixes a proxy never needs to serve (each loaded on first use where it is needed):
# cryptography only where a broker's handle keyring seals or opens tokens (a proxy only reads
# the clear broker name), the broker store, benches, the console, Spark, httpx (etcd only),
# lark (the first SQL92 filter).
_NOT_IN_A_PROXY = (
    "cryptography",
    "popmq.broker.pop.handle_keys",
    "popmq.broker.store",
    "popmq.bench",
    "popmq.console",
    "pyspark",
    "httpx",
    "lark",
)

_PROBE = """
import sys
import popmq.cli, popmq.cli.proxy_cmd, popmq.proxy.runtime
popmq.proxy.runtime.embedded_registries([])  # what serve_proxy asks at start (issue 18)
print("\\n".join(sorted(sys.modules)))
"""


def test_proxy_start_up_leaves_out_what_only_brokers_and_tools_need() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = done.stdout.split()
    assert "popmq.proxy.runtime" in loaded  # the probe ran the real imports
    unwanted = [m for m in loaded if m.startswith(_NOT_IN_A_PROXY)]
    assert unwanted == []
