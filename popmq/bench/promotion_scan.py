"""What a promotion costs with a large commitlog: opening the store of a follower's copy
with the indexes the follower kept (broker/replication/indexer.py), all of them or all but the
last 8 MiB, against without them (what every promotion did before: a walk of the whole
commitlog).

Not a test: ``python -m popmq.bench.promotion_scan [MB] [DIR]`` prints one JSON line.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import anyio

from popmq.broker.contract.types import Message
from popmq.broker.replication.files import list_segments, log_end
from popmq.broker.replication.indexer import ReplicaIndexer
from popmq.broker.store import metafile
from popmq.broker.store.message_store import MessageStore
from popmq.config import StoreConfig

BODY = 1024
QUEUES = 8
TAIL_BYTES = 8 << 20  # the third case: promoted with this much not indexed yet


async def _fill(data_dir: Path, megabytes: int) -> int:
    store = MessageStore(data_dir, "bench", StoreConfig(flush="async"))
    store.open()
    await store.start()
    try:
        store.create_topic("bench", QUEUES)
        body = bytes(BODY)
        count = megabytes * 1024 * 1024 // (BODY + 100)
        for start in range(0, count, 256):
            batch = [Message("bench", body, tag="t") for _ in range(min(256, count - start))]
            await store.append("bench", (start // 256) % QUEUES, batch)
        return count
    finally:
        await store.aclose()


def _open_seconds(data_dir: Path) -> tuple[float, int, int]:
    store = MessageStore(data_dir, "bench", StoreConfig(flush="async"))
    started = time.perf_counter()
    store.open()
    seconds = time.perf_counter() - started
    report = store.recovery
    assert report is not None
    result = (seconds, report.records_scanned, report.bytes_scanned)
    anyio.run(store.aclose)
    return result


def _as_follower_left_it(data_dir: Path) -> None:
    """What a follower used to leave: no indexes, a checkpoint at position 0."""
    shutil.rmtree(data_dir / "index", ignore_errors=True)
    for _ in range(2):
        metafile.write(data_dir / "checkpoint.json", {"position": 0, "queues": {}})


def run(megabytes: int, root: Path) -> dict[str, float | int]:
    data_dir = root / "copy"
    records = anyio.run(_fill, data_dir, megabytes)
    end = log_end(list_segments(data_dir))
    _as_follower_left_it(data_dir)
    before = _open_seconds(data_dir)
    # The follower's indexer over the same copy (it runs after acks while following).
    indexer = ReplicaIndexer(data_dir)
    indexer.start()
    indexer.applied(end, complete=True)
    started = time.perf_counter()
    while indexer.position < end - TAIL_BYTES:  # a tail not indexed yet when promoted
        indexer.index_some()
    indexer.close()
    tail = _open_seconds(data_dir)
    indexer = ReplicaIndexer(data_dir)
    indexer.resume()
    indexer.applied(end, complete=True)
    while indexer.behind:
        indexer.index_some()
    indexing_s = time.perf_counter() - started
    indexer.close()
    after = _open_seconds(data_dir)
    return {
        "commitlog_mb": round(end / 1048576, 1),
        "records": records,
        "before_open_s": round(before[0], 3),
        "before_records_walked": before[1],
        "before_bytes_walked": before[2],
        "after_open_s": round(after[0], 3),
        "after_records_walked": after[1],
        "after_bytes_walked": after[2],
        "tail_open_s": round(tail[0], 3),
        "tail_records_walked": tail[1],
        "tail_bytes_walked": tail[2],
        "follower_indexing_s": round(indexing_s, 3),
    }


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    if len(sys.argv) > 2:
        root = Path(sys.argv[2])
        root.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run(megabytes, root)))
        return
    with tempfile.TemporaryDirectory(prefix="popmq-promotion-") as tmp:
        print(json.dumps(run(megabytes, Path(tmp))))


if __name__ == "__main__":
    main()
