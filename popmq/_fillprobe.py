# TEMPORARY instrumentation (not committed)
import collections, json, os, time
STATS = collections.defaultdict(collections.Counter)
_last = [0.0]
def note(kind, key):
    STATS[kind][str(key)] += 1
    now = time.monotonic()
    if now - _last[0] > 1.0:
        _last[0] = now
        with open(f"/tmp/fillprobe-{os.getpid()}.json", "w") as f:
            json.dump({k: dict(v) for k, v in STATS.items()}, f)
