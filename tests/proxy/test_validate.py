"""Name and field validation with RocketMQ's codes."""

from __future__ import annotations

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.proxy.core import validate


def code_of(fn, *args, **kwargs) -> Code | None:
    try:
        fn(*args, **kwargs)
    except RefusedError as exc:
        return exc.code
    return None


@pytest.mark.parametrize("name", ["orders", "a-b_c", "T%1", "x" * 127])
def test_good_topics(name: str) -> None:
    assert code_of(validate.topic_name, name) is None


@pytest.mark.parametrize(
    "name", ["", "  ", "has space", "slash/no", "x" * 128, "%RETRY%g_t", "%SYS%x", "é"]
)
def test_bad_topics(name: str) -> None:
    assert code_of(validate.topic_name, name) == Code.ILLEGAL_TOPIC


def test_dlq_topic_readable_only_where_allowed() -> None:
    assert code_of(validate.topic_name, "%DLQ%g") == Code.ILLEGAL_TOPIC
    assert code_of(validate.topic_name, "%DLQ%g", allow_dlq=True) is None


@pytest.mark.parametrize("name", ["", "a b", "x" * 256, "%DLQ%x", "g\n"])
def test_bad_groups(name: str) -> None:
    assert code_of(validate.group_name, name) == Code.ILLEGAL_CONSUMER_GROUP


def test_body_limits() -> None:
    assert code_of(validate.body, b"", 10) == Code.MESSAGE_BODY_EMPTY
    assert code_of(validate.body, b"x" * 11, 10) == Code.MESSAGE_BODY_TOO_LARGE
    assert code_of(validate.body, b"x" * 10, 10) is None


def test_tags_keys_groups_properties() -> None:
    assert code_of(validate.tag, "a|b") == Code.ILLEGAL_MESSAGE_TAG
    assert code_of(validate.tag, "  ") == Code.ILLEGAL_MESSAGE_TAG
    assert code_of(validate.tag, "") is None
    assert code_of(validate.keys, ["ok", " "]) == Code.ILLEGAL_MESSAGE_KEY
    assert code_of(validate.message_group, "g" * 65) == Code.ILLEGAL_MESSAGE_GROUP
    assert code_of(validate.properties, {"__popmq.origin_topic": "x"}) == (
        Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    )
    assert code_of(validate.properties, {"k": "v" * 20_000}) == Code.MESSAGE_PROPERTIES_TOO_LARGE


def test_keys_properties_and_handles_are_bounded() -> None:
    """Issue 20, defects 5 and 10: a 16 MiB key, 200,000 keys, or 64 KB receipt handles were
    accepted (keys escaped the body limit; handles were kept and echoed back)."""
    assert code_of(validate.keys, ["k" * (16 << 20)]) == Code.ILLEGAL_MESSAGE_KEY
    assert code_of(validate.keys, [f"k{i}" for i in range(200_000)]) == Code.ILLEGAL_MESSAGE_KEY
    assert code_of(validate.keys, [f"k{i}" for i in range(100)]) is None
    many = {f"p{i}": "v" for i in range(129)}
    assert code_of(validate.properties, many) == Code.MESSAGE_PROPERTIES_TOO_LARGE
    assert code_of(validate.receipt_handle, "h" * 65_536) == Code.INVALID_RECEIPT_HANDLE
    assert code_of(validate.receipt_handle, "h" * 400) is None


def test_an_oversized_key_is_refused_before_its_characters_are_read() -> None:
    """A 16 MiB key cost the proxy 3 s of CPU before its refusal (every character was looked at
    in a Python loop, and before its size): the size is checked first now, the characters with
    one regular expression."""
    with pytest.raises(RefusedError, match="take more than") as refused:
        validate.keys(["k" * (16 << 20) + "\x01"])
    assert refused.value.code == Code.ILLEGAL_MESSAGE_KEY
    # the same characters count as control characters as before: C0 and DEL
    for point in range(0x300):
        assert validate._has_control_chars(f"a{chr(point)}b") == (point < 32 or point == 127)


def test_invisible_time_range() -> None:
    assert code_of(validate.invisible_time, 999, 1_000, 5_000) == Code.ILLEGAL_INVISIBLE_TIME
    assert code_of(validate.invisible_time, 5_001, 1_000, 5_000) == Code.ILLEGAL_INVISIBLE_TIME
    assert code_of(validate.invisible_time, 1_000, 1_000, 5_000) is None
