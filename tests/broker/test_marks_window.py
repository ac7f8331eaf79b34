"""A change mark numbered by a worker thread but not yet stored when a snapshot reads the
marks: the snapshot's ticket must not cover that change (the sync barrier would answer a
write its batch does not hold). Found by review (helper review-s10b)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from popmq.broker.replication.files import DataSnapshotter
from popmq.broker.store import changes


def test_a_mark_numbered_but_not_stored_is_not_covered_by_a_snapshot_ticket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "leader"
    data.mkdir()
    (data / "consumer_offsets.json").write_bytes(b"[1]")
    snapshotter = DataSnapshotter(data, 0)
    snapshotter.take([], 0.0)  # the first look: every file (the document is sent)
    numbered, resume = threading.Event(), threading.Event()
    real = changes._ticket

    class Descheduled:
        """The writer thread is switched out between taking its number and storing it
        (a GIL switch after the call to next(), before the store into _marks)."""

        def __next__(self) -> int:
            value = next(real)
            if threading.current_thread().name == "checkpoint":
                numbered.set()
                resume.wait(5)
            return value

    monkeypatch.setattr(changes, "_ticket", Descheduled())

    def checkpoint_thread() -> None:  # update_consumer_offset's checkpoint: document, mark
        (data / "consumer_offsets.json").write_bytes(b"[2, 3]")
        changes.note(changes.ENTRIES)  # fsync_dir's mark

    writer = threading.Thread(target=checkpoint_thread, name="checkpoint")
    writer.start()
    assert numbered.wait(5)
    taken = []

    def loop_side() -> None:  # meanwhile on the loop: a send, then the sender's snapshot
        changes.note(changes.COMMITLOG)
        taken.append(snapshotter.take([], 0.5))  # not a full look (FULL_LOOK_S is 1 s)

    loop = threading.Thread(target=loop_side)
    loop.start()
    loop.join(0.5)  # with marks stored atomically this waits for the writer: let it go on
    resume.set()
    writer.join(5)
    loop.join(5)
    ticket = changes.newest()  # update_consumer_offset asks the barrier now: its ticket
    snapshot = taken[0]
    held = any(f.path == "consumer_offsets.json" for f in snapshot.files)
    assert snapshot.complete
    assert held or snapshot.ticket < ticket, (
        f"a batch of ticket {snapshot.ticket} answers the write (ticket {ticket}) "
        "without its document"
    )
