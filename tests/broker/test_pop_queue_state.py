from popmq.broker.pop.queue_state import QueueState


def test_out_of_order_done_advances_commit_only_over_prefix() -> None:
    state = QueueState(10)
    for offset in range(10, 15):
        state.add_inflight(offset, "ck")
    state.advance_cursor(15)
    assert state.commit_offset() == 10
    assert not state.mark_done(12)
    assert not state.mark_done(11)
    assert state.mark_done(10)
    assert state.committed == 13
    assert state.mark_done(14) is False
    assert state.mark_done(13)
    assert state.committed == 15


def test_cursor_skips_known_offsets_ahead() -> None:
    state = QueueState(0)  # after a restart: cursor at the committed offset
    state.add_inflight(3, "recovered")
    state.done_ahead.add(4)
    assert state.is_known(3) and state.is_known(4) and not state.is_known(2)
    assert state.advance_cursor(6)
    assert state.committed == 3  # 3 is still in flight
    assert not state.done_ahead


def test_owner_guard() -> None:
    state = QueueState(0)
    state.add_inflight(0, "old")
    state.advance_cursor(1)
    assert state.transfer(0, "old", "new")
    assert state.mark_done(0, "old") is False
    assert state.committed == 0
    assert state.mark_done(0, "new")
    assert state.committed == 1


def test_release_holds_commit_and_redelivers_in_order() -> None:
    state = QueueState(0)
    for offset in range(4):
        state.add_inflight(offset, "ck")
    state.advance_cursor(4)
    state.mark_done(1, "ck")
    state.release(2, "ck", attempts=1)
    state.release(0, "ck", attempts=1)
    assert state.committed == 0
    assert state.take_released(10) == [0, 2]
    assert state.attempts == {0: 1, 2: 1}
    state.add_inflight(0, "ck2")
    state.add_inflight(2, "ck2")
    state.mark_done(0, "ck2")
    assert state.committed == 2
    state.mark_done(2, "ck2")
    state.mark_done(3, "ck")
    assert state.committed == 4
    assert not state.attempts
