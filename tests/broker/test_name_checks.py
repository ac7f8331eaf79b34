"""The name checks remember accepted names (broker/names.py): remembering must never accept a
name under a rule it was not checked against, and must stay bounded."""

from __future__ import annotations

import pytest
from popmq.broker import names
from popmq.broker.contract.errors import Code, RefusedError


def test_a_dlq_topic_accepted_for_consumers_is_still_refused_to_producers() -> None:
    assert names.check_topic("%DLQ%g1", allow_dlq=True) == "%DLQ%g1"
    with pytest.raises(RefusedError) as refused:
        names.check_topic("%DLQ%g1")
    assert refused.value.code == Code.ILLEGAL_TOPIC


def test_a_name_accepted_as_a_topic_is_checked_again_as_a_group() -> None:
    long_name = "t" * (names.GROUP_MAX_LENGTH + 1)  # a valid topic, too long for a group
    assert names.check_topic(long_name) == long_name
    with pytest.raises(RefusedError) as refused:
        names.check_group(long_name)
    assert refused.value.code == Code.ILLEGAL_CONSUMER_GROUP


def test_refused_names_are_refused_every_time_and_not_remembered() -> None:
    for _ in range(2):
        with pytest.raises(RefusedError):
            names.check_topic("bad topic")
        with pytest.raises(RefusedError):
            names.check_group("%RETRY%g")
        with pytest.raises(RefusedError):
            names.check_topic(None)  # type: ignore[arg-type]
    assert ("bad topic", True, False) not in names._accepted_topics
    assert "%RETRY%g" not in names._accepted_groups


def test_the_remembered_names_stay_bounded() -> None:
    for i in range(names._ACCEPTED_MAX + 10):
        names.check_topic(f"made-up-{i}")
        names.check_group(f"made-up-{i}")
    assert len(names._accepted_topics) <= names._ACCEPTED_MAX
    assert len(names._accepted_groups) <= names._ACCEPTED_MAX
    assert names.check_topic("made-up-0") == "made-up-0"  # still checked, and still fine
