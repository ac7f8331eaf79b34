"""Chaos: damaged data files under a real `popmq broker` (issue 9).

One broker writes N acknowledged messages (sync flush), pops and acks some (so consumer
offsets, the groups log and the pop journal exist), waits for a flush and is killed -9.
Each scenario copies that data directory, damages one file (byte flips, truncation or
deletion), restarts a broker on it and reads every queue back over gRPC. It counts:

- written: messages acknowledged before the crash;
- recovered: of those, messages read back after the restart;
- quarantined: messages the broker reported lost (popmq_broker_store_quarantined_frames of
  commitlog files at start, popmq_broker_store_corrupt_reads for damage behind recovery's
  walk found by the reads: logged at ERROR, bytes copied to DATA/quarantine/);
- notices: metric series the broker raised about the damage (quarantine, metadata fallbacks);
- lost silently: written - recovered - quarantined. It must be 0 in every scenario.

Run with ``pytest -s`` to see the table; it is also written to the test's log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from popmq.broker.contract.types import AckEntry, GroupConfig, Message, PopRequest, PullRequest
from popmq.broker.wire.remote import RemoteBrokerPort
from prometheus_client.parser import text_string_to_metric_families
from support.broker_process import BrokerProcess

log = logging.getLogger(__name__)

TOPIC, GROUP, QUEUES = "chaos", "cg", 4
MESSAGES = 240  # acknowledged sends, 60 per queue
FAST = [
    "--set", "broker.store.segment_bytes=8192",  # several segments: damage behind the checkpoint
    "--set", "broker.store.flush_interval_ms=50",
    "--set", "broker.pop.checkpoint_buffer_ms=50",
    "--set", "broker.pop.min_invisible_ms=1",
]  # fmt: skip


def body(i: int) -> bytes:
    return f"chaos-{i:05d}|".encode() * (2 + i % 7)


# -- damage ------------------------------------------------------------------------------------


def _segment(data: Path, which: str = "last") -> Path:
    files = sorted((data / "commitlog").iterdir())
    return {"first": files[0], "middle": files[len(files) // 2], "last": files[-1]}[which]


def _index(data: Path) -> Path:
    return sorted((data / "index" / TOPIC / "1").iterdir())[-1]


def _flip(path: Path, fraction: float, count: int = 8) -> None:
    size = path.stat().st_size
    at = min(int(size * fraction), max(size - count, 0))
    with path.open("r+b") as f:
        f.seek(at)
        chunk = f.read(count)
        f.seek(at)
        f.write(bytes(b ^ 0xA5 for b in chunk))


def _truncate(path: Path, fraction: float) -> None:
    os.truncate(path, int(path.stat().st_size * fraction))


def _delete(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _meta(name: str) -> Callable[[Path], Path]:
    return lambda data: data / name


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "commitlog head: 8 bytes flipped": lambda d: _flip(_segment(d, "first"), 0.01),
    "commitlog middle: 8 bytes flipped": lambda d: _flip(_segment(d, "middle"), 0.5),
    "commitlog tail: 8 bytes flipped": lambda d: _flip(_segment(d), 0.999),
    "commitlog middle segment truncated to 60%": lambda d: _truncate(_segment(d, "middle"), 0.6),
    "commitlog tail: last 100 bytes cut": lambda d: os.truncate(
        _segment(d), _segment(d).stat().st_size - 100
    ),
    "commitlog middle segment deleted": lambda d: _delete(_segment(d, "middle")),
    "commitlog last segment deleted": lambda d: _delete(_segment(d)),
    "index: 8 bytes flipped": lambda d: _flip(_index(d), 0.5),
    "index: truncated to 50%": lambda d: _truncate(_index(d), 0.5),
    "index file deleted": lambda d: _delete(_index(d)),
    "pop journal: 8 bytes flipped": lambda d: _flip(d / "pop" / "journal.log", 0.3),
    "pop journal: truncated to 50%": lambda d: _truncate(d / "pop" / "journal.log", 0.5),
    "pop journal deleted": lambda d: _delete(d / "pop" / "journal.log"),
    "FORMAT deleted": lambda d: _delete(d / "FORMAT"),
}
for _name in ("checkpoint.json", "consumer_offsets.json"):
    SCENARIOS[f"{_name}: 8 bytes flipped"] = lambda d, n=_name: _flip(d / n, 0.5)
    SCENARIOS[f"{_name} deleted (and .prev)"] = lambda d, n=_name: _delete(d / n, d / (n + ".prev"))
for _name in ("topics.log", "state/groups.log"):  # append-only record logs
    SCENARIOS[f"{_name}: 8 bytes flipped"] = lambda d, n=_name: _flip(d / n, 0.5)
    SCENARIOS[f"{_name}: truncated to 50%"] = lambda d, n=_name: _truncate(d / n, 0.5)
    SCENARIOS[f"{_name} deleted"] = lambda d, n=_name: _delete(d / n)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    written: int
    recovered: int = 0
    quarantined: int = 0
    notices: int = 0

    @property
    def lost_silently(self) -> int:
        return max(self.written - self.recovered - self.quarantined, 0)

    @property
    def over_reported(self) -> int:
        return max(self.recovered + self.quarantined - self.written, 0)


async def _flushed(data: Path, within_s: float = 30.0) -> None:
    """Wait until the files the scenarios damage hold what this run wrote: the acks' offsets
    flushed, the pop journal and groups log written (a fixed sleep raced a loaded machine)."""
    deadline = asyncio.get_running_loop().time() + within_s

    def ready() -> bool:
        offsets = data / "consumer_offsets.json"
        if not offsets.exists() or f'"{GROUP}"' not in offsets.read_text():
            return False
        others = ("checkpoint.json", "pop/journal.log", "state/groups.log", "topics.log")
        return all((data / name).exists() and (data / name).stat().st_size > 0 for name in others)

    while not ready():
        assert asyncio.get_running_loop().time() < deadline, "the broker never flushed"
        await asyncio.sleep(0.1)


async def _write_golden(data: Path, log_path: Path) -> None:
    broker = BrokerProcess(data, "chaos-a", log_path, *FAST)
    await broker.start()
    remote = RemoteBrokerPort("chaos-a", broker.address, rpc_timeout_s=10.0)
    try:
        await remote.create_topic(TOPIC, QUEUES)
        for name in ("cg-a", "cg-b", "cg-c"):  # records in the groups log
            await remote.update_group(GroupConfig(name, max_attempts=5))
        for start in range(0, MESSAGES, 12):
            batch = [Message(TOPIC, body(i)) for i in range(start, min(start + 12, MESSAGES))]
            await remote.send(batch, (start // 12) % QUEUES)
        # Consumer state: some acked, some left in flight (spilled to the pop journal).
        popped = await remote.pop(PopRequest(GROUP, TOPIC, max_messages=32,
                                             invisible_time_ms=600_000))  # fmt: skip
        handles = [p.receipt_handle for p in popped.messages]
        await remote.ack(GROUP, TOPIC, [AckEntry(h) for h in handles[: len(handles) // 2]])
        await _flushed(data)  # checkpoints spilled, offsets and checkpoint flushed
    finally:
        await remote.aclose()
        await broker.kill()


async def _count_after_restart(data: Path, log_path: Path, row: Row) -> None:
    broker = BrokerProcess(data, "chaos-b", log_path, *FAST, metrics=True)
    await broker.start()
    remote = RemoteBrokerPort("chaos-b", broker.address, rpc_timeout_s=10.0)
    seen: set[bytes] = set()
    try:
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                result = await remote.pull(PullRequest(TOPIC, queue_id, offset, 64))
                seen.update(m.body for m in result.messages)
                if result.next_offset <= offset or result.next_offset >= result.max_offset:
                    break
                offset = result.next_offset
        text = await asyncio.to_thread(broker.scrape)
    finally:
        await remote.aclose()
        await broker.kill()
    row.recovered = len(seen & {body(i) for i in range(MESSAGES)})
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(("popmq_broker_store_quarantined",
                                       "popmq_broker_store_metadata",
                                       "popmq_broker_store_corrupt")):  # fmt: skip
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total") or sample.value <= 0:
                continue
            row.notices += 1
            frames = sample.name == "popmq_broker_store_quarantined_frames_total"
            if frames and sample.labels["file"].startswith("commitlog"):
                row.quarantined += int(sample.value)
            if sample.name == "popmq_broker_store_corrupt_reads_total":  # found by our reads
                row.quarantined += int(sample.value)


def format_rows(rows: list[Row]) -> str:
    head = ("scenario", "written", "recovered", "quarantined", "notices", "lost silently")
    cells = [head] + [
        (
            r.scenario,
            str(r.written),
            str(r.recovered),
            str(r.quarantined),
            str(r.notices),
            str(r.lost_silently),
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i])
                       for i in range(len(head))) for c in cells]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@pytest.mark.timeout(600)  # 27 broker starts: minutes on a loaded CI machine (a failure bound)
async def test_damaged_files_never_lose_messages_silently(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    await _write_golden(golden, tmp_path / "golden.log")
    rows: list[Row] = []
    for number, (scenario, damage) in enumerate(SCENARIOS.items()):
        data = tmp_path / f"s{number:02d}"
        shutil.copytree(golden, data)
        damage(data)
        row = Row(scenario, MESSAGES)
        await _count_after_restart(data, tmp_path / f"s{number:02d}.log", row)
        rows.append(row)
        shutil.rmtree(data)
    table = format_rows(rows)
    print("\n" + table)
    log.info("storage corruption scenarios:\n%s", table)
    assert [r.scenario for r in rows if r.lost_silently] == [], table
    assert [r.scenario for r in rows if r.over_reported] == [], table
    # Every scenario was noticed (a metric series moved).
    unnoticed = [r.scenario for r in rows if not r.notices]
    assert unnoticed == [], table
