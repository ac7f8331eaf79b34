from __future__ import annotations

import pytest
from popmq.broker.contract.types import PoppedMessage
from popmq.proxy.longpoll.custody import Custody
from popmq.proxy.longpoll.rate import SlidingRate

from popmq.clock import ManualClock

from .fake_broker import FakeBroker

# Virtual time (looptime): sleeps and deadlines take no real time, timing asserts are exact.
pytestmark = pytest.mark.looptime


def _popped(broker: FakeBroker, n: int) -> list[PoppedMessage]:
    return [PoppedMessage(m, f"h{m.message_id}", 0) for m in broker.put(n)]


def test_custody_hands_over_then_releases_late_arrivals() -> None:
    released: list[tuple[str, int]] = []
    custody = Custody(lambda port, msgs: released.append((port.name, len(msgs))))
    broker = FakeBroker("b0")
    custody.keep(broker, _popped(broker, 2))
    custody.keep(broker, [])
    assert custody.count == 2
    assert len(custody.hand_over()) == 2
    assert released == []
    custody.keep(broker, _popped(broker, 1))  # arrives after the hand-over: nobody takes it
    assert released == [("b0", 1)]


def test_an_empty_custody_holds_no_list_and_answers_every_question() -> None:
    # Most idle long polls never hold a message: their custody makes no list (wave 9).
    custody = Custody(lambda port, msgs: None)
    assert custody._held is None
    assert custody.count == 0 and custody.ports() == []
    assert custody.hand_over() == []
    custody.abandon()


def test_custody_abandon_releases_everything() -> None:
    released: list[int] = []
    custody = Custody(lambda port, msgs: released.append(len(msgs)))
    broker = FakeBroker("b0")
    custody.keep(broker, _popped(broker, 3))
    custody.abandon()
    assert released == [3]
    assert custody.hand_over() == []


def test_sliding_rate_counts_only_the_window() -> None:
    now = ManualClock(100.0)
    rate = SlidingRate(window_s=10.0, buckets=10, clock=now, warmup_s=10.0)
    for _ in range(50):
        rate.add()
    assert rate.per_second() == 5.0
    now.now_s += 5.0
    rate.add(50)
    assert rate.per_second() == 10.0
    now.now_s += 6.0  # the first 50 fell out of the window
    assert rate.per_second() == 5.0
    now.now_s += 20.0
    assert rate.per_second() == 0.0


def test_sliding_rate_warms_up_over_the_elapsed_time() -> None:
    now = ManualClock(0.0)
    rate = SlidingRate(window_s=10.0, buckets=10, clock=now, warmup_s=1.0)
    assert rate.per_second() == 0.0
    rate.add(50)
    assert rate.per_second() == 50.0  # not yet a second in: over the 1 s minimum
    now.now_s = 2.0
    rate.add(50)
    assert rate.per_second() == 50.0  # 100 over the 2 s so far, not over the 10 s window
    now.now_s = 5.0
    assert rate.per_second() == 20.0
    now.now_s = 11.0
    assert rate.per_second() == 5.0  # a full window: the first 50 fell out
