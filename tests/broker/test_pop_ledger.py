from pathlib import Path

from popmq.broker.pop.checkpoint import EntryState
from popmq.broker.pop.journal import PopJournal
from popmq.broker.pop.ledger import CheckpointLedger


def _ledger(journal: PopJournal | None = None, offsets: dict | None = None):
    commits: dict[tuple[str, str, int], int] = {}
    start = offsets or {}

    def start_offset(group: str, topic: str, queue_id: int) -> int:
        return start.get((group, topic, queue_id), 0)

    def commit(group: str, topic: str, queue_id: int, offset: int) -> None:
        commits[(group, topic, queue_id)] = offset

    ledger = CheckpointLedger(journal, start_offset, commit, first_id=1000)
    return ledger, _Commits(ledger, commits)


class _Commits:
    """The offsets handed to ``commit``, read after flushing the ledger's batch."""

    def __init__(self, ledger: CheckpointLedger, seen: dict) -> None:
        self._ledger = ledger
        self._seen = seen

    def __getitem__(self, key: tuple[str, str, int]) -> int:
        self._ledger.flush_commits()
        return self._seen[key]

    def __eq__(self, other: object) -> bool:
        self._ledger.flush_commits()
        return self._seen == other


def _pop(ledger: CheckpointLedger, offsets: list[int], until: int = 100, t: int = 0):
    ck = ledger.open("g", "t", 0, offsets, [0] * len(offsets), t, until, fifo=False)
    ledger.advance_cursor("g", "t", 0, offsets[-1] + 1)
    return ck


def test_ack_commits_done_prefix_and_finishes_checkpoint() -> None:
    ledger, commits = _ledger()
    ck = _pop(ledger, [0, 1, 2])
    ledger.ack(ck, 1)
    assert commits == {}
    ledger.ack(ck, 0)
    assert commits[("g", "t", 0)] == 2
    ledger.ack(ck, 2)
    assert commits[("g", "t", 0)] == 3
    assert ck.ck_id not in ledger.live
    assert ledger.find(ck.ck_id) is ck  # still answerable for a repeated ack


def test_due_and_revive() -> None:
    ledger, commits = _ledger()
    first = _pop(ledger, [0, 1], until=50)
    second = _pop(ledger, [2], until=40)
    ledger.ack(first, 0)
    assert ledger.next_due_ms() == 40
    assert ledger.take_due(39) == []
    assert ledger.take_due(60) == [second, first]
    ledger.revived(first, 1)
    assert commits[("g", "t", 0)] == 2
    assert ledger.next_due_ms() == 40 or ledger.next_due_ms() is None


def test_change_supersedes_old_entry() -> None:
    ledger, _ = _ledger()
    ck = _pop(ledger, [0, 1], until=50)
    new = ledger.change(ck, 1, pop_time_ms=10, invisible_until_ms=500)
    assert ck.state(1) == EntryState.SUPERSEDED and new.offsets == [1]
    ledger.ack(ck, 0)
    assert ck.ck_id not in ledger.live  # nothing pending in the old one
    assert ledger.take_due(100) == []
    assert ledger.take_due(600) == [new]
    assert ledger.inflight_count("g", "t", 0) == 1


def test_spill_only_unacked_after_buffer(tmp_path: Path) -> None:
    journal = PopJournal(tmp_path / "pop.journal")
    ledger, _ = _ledger(journal)
    acked = _pop(ledger, [0], t=0)
    kept = _pop(ledger, [1, 2], t=0)
    ledger.ack(acked, 0)
    assert ledger.spill(now_ms=5, buffer_ms=10) == 0
    assert ledger.spill(now_ms=10, buffer_ms=10) == 1
    assert kept.spilled and not acked.spilled
    ledger.ack(kept, 0)  # journaled because the checkpoint is on disk
    journal.flush()
    loaded = PopJournal(tmp_path / "pop.journal").load()
    assert [(ck.ck_id, list(ck.states)) for ck in loaded] == [(kept.ck_id, [1, 0])]


def test_recover_rebuilds_inflight_and_done_ahead(tmp_path: Path) -> None:
    path = tmp_path / "pop.journal"
    journal = PopJournal(path)
    ledger, _ = _ledger(journal)
    ck = _pop(ledger, [0, 1, 2], until=70)
    other = _pop(ledger, [3], until=80)
    ledger.spill(10_000, 0)
    ledger.ack(ck, 1)
    ledger.ack(other, 0)
    journal.close()

    # committed offset was persisted as 0: 1 and 3 are done ahead, 0 and 2 in flight again
    recovered, commits = _ledger(PopJournal(path))
    cks = PopJournal(path).load()
    assert recovered.recover(cks) == 1
    queue = recovered.queue("g", "t", 0)
    assert set(queue.inflight) == {0, 2}
    # the cursor moved over the known run 0..3 (nothing there to read again)
    assert queue.pop_offset == 4 and not queue.done_ahead and queue.committed == 0
    assert recovered.next_due_ms() == 70
    live = recovered.take_due(100)[0]
    recovered.revived(live, 0)
    recovered.revived(live, 2)
    assert commits[("g", "t", 0)] == 4


def test_recover_ignores_entries_below_committed(tmp_path: Path) -> None:
    path = tmp_path / "pop.journal"
    journal = PopJournal(path)
    ledger, _ = _ledger(journal)
    _pop(ledger, [0, 1])
    ledger.spill(10_000, 0)
    journal.close()
    recovered, _ = _ledger(PopJournal(path), offsets={("g", "t", 0): 2})
    assert recovered.recover(PopJournal(path).load()) == 0
    assert recovered.inflight_count("g", "t", 0) == 0


def test_compaction_keeps_only_needed(tmp_path: Path) -> None:
    path = tmp_path / "pop.journal"
    journal = PopJournal(path)
    ledger, _ = _ledger(journal)
    done = _pop(ledger, [0])
    live = _pop(ledger, [1])
    ledger.spill(10_000, 0)
    ledger.ack(done, 0)
    for _ in range(50):
        journal.write_state(live.ck_id, 0, EntryState.PENDING)
    before = journal.size
    journal.rewrite(ledger.journaled())
    assert journal.size < before
    assert [ck.ck_id for ck in journal.load()] == [live.ck_id]
    journal.write_state(live.ck_id, 0, EntryState.ACKED)
    journal.flush()
    assert PopJournal(path).load()[0].state(0) == EntryState.ACKED


def test_compaction_keeps_acks_above_the_offset_on_disk(tmp_path: Path) -> None:
    # An acked checkpoint below the in-memory commit offset may only leave the journal once
    # that offset is on disk: until then a crash would fall back and redeliver it.
    path = tmp_path / "pop.journal"
    journal = PopJournal(path)
    ledger, commits = _ledger(journal)
    done = _pop(ledger, [0])
    ledger.spill(10_000, 0)
    ledger.ack(done, 0)
    assert commits[("g", "t", 0)] == 1  # committed in memory
    assert ledger.journaled(lambda key: 1) == []  # offset 1 on disk: the ack may go
    kept = ledger.journaled(lambda key: -1)  # nothing on disk yet: keep the ack
    assert [ck.ck_id for ck in kept] == [done.ck_id]
    journal.rewrite(kept)
    journal.close()
    (reloaded,) = PopJournal(path).load()  # the ack survived the compaction
    assert reloaded.ck_id == done.ck_id and reloaded.state(0) == EntryState.ACKED
