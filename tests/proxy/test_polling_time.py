"""ReceiveMessage's poll time: clamping to [min, max] and to the client's deadline."""

from __future__ import annotations

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.proxy.core.receive import DEFAULT_REQUEST_TIMEOUT_MS, polling_time_ms

from popmq.config import ProxyConfig

CONFIG = ProxyConfig(min_long_polling_ms=5_000, max_long_polling_ms=20_000,
                     long_polling_reserve_ms=100)  # fmt: skip


def test_within_range_is_kept() -> None:
    assert polling_time_ms(7_000, 60_000, CONFIG) == 7_000


def test_above_max_is_clamped() -> None:
    assert polling_time_ms(60_000, 120_000, CONFIG) == 20_000


def test_positive_below_min_is_illegal() -> None:
    with pytest.raises(RefusedError) as err:
        polling_time_ms(1_000, 60_000, CONFIG)
    assert err.value.code == Code.ILLEGAL_POLLING_TIME


def test_zero_means_minimum() -> None:
    assert polling_time_ms(0, 60_000, CONFIG) == 5_000


def test_negative_is_illegal() -> None:
    with pytest.raises(RefusedError) as err:
        polling_time_ms(-1, 60_000, CONFIG)
    assert err.value.code == Code.ILLEGAL_POLLING_TIME


def test_absent_uses_deadline_minus_half_request_timeout() -> None:
    remaining = 12_000
    assert polling_time_ms(None, remaining, CONFIG) == remaining - DEFAULT_REQUEST_TIMEOUT_MS // 2


def test_absent_without_deadline_is_max() -> None:
    assert polling_time_ms(None, None, CONFIG) == 20_000


def test_never_past_deadline_minus_reserve() -> None:
    # Python client: deadline = awaitDuration (20 s) + request timeout (3 s)
    assert polling_time_ms(20_000, 23_000, CONFIG) == 20_000
    # a tighter deadline cuts the poll to what is left minus the reserve
    assert polling_time_ms(20_000, 8_000, CONFIG) == 8_000 - 100


def test_deadline_shorter_than_min_is_illegal() -> None:
    with pytest.raises(RefusedError) as err:
        polling_time_ms(6_000, 3_000, CONFIG)
    assert err.value.code == Code.ILLEGAL_POLLING_TIME


def test_a_crowd_of_held_polls_keeps_more_room_before_the_deadline() -> None:
    # 13 s left, 10 s asked: room enough alone; with 3 s of load reserve (6,000 held at
    # 0.5 ms, or a lagging loop) the poll ends 3.1 s before the deadline instead.
    assert polling_time_ms(10_000, 13_000, CONFIG, load_ms=0) == 10_000
    assert polling_time_ms(10_000, 13_000, CONFIG, load_ms=3_000) == 13_000 - 100 - 3_000
    # Never below the minimum because of load (that is not the client's mistake).
    assert polling_time_ms(10_000, 13_000, CONFIG, load_ms=50_000) == 5_000
