import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.pop.names import check_group, check_topic


@pytest.mark.parametrize("name", ["orders", "a-b_c|d%e", "x" * 127])
def test_valid_topics(name: str) -> None:
    check_topic(name, user=not name.startswith("%"))


@pytest.mark.parametrize("name", ["", "x" * 128, "a b", "a/b", "t.opic", "%RETRY%g_t", "%DLQ%g"])
def test_illegal_user_topics(name: str) -> None:
    with pytest.raises(RefusedError) as err:
        check_topic(name)
    assert err.value.code == Code.ILLEGAL_TOPIC


def test_system_topic_allowed_for_internal_use() -> None:
    check_topic("%RETRY%g_t", user=False)


@pytest.mark.parametrize("name", ["", "g" * 128, "g 1", "%SYS%x", "g$"])
def test_illegal_groups(name: str) -> None:
    with pytest.raises(RefusedError) as err:
        check_group(name)
    assert err.value.code == Code.ILLEGAL_CONSUMER_GROUP


def test_longest_accepted_names_make_valid_derived_names() -> None:
    """Issue 9, defect 1: every accepted (group, topic) has a valid retry and DLQ topic."""
    from popmq.broker.names import GROUP_MAX_LENGTH, TOPIC_MAX_LENGTH, dlq_topic, retry_topic
    from popmq.proxy.core import validate

    group, topic = "g" * GROUP_MAX_LENGTH, "t" * TOPIC_MAX_LENGTH
    check_group(group)
    validate.group_name(group)
    check_topic(topic)
    check_topic(retry_topic(group, topic), user=False)  # the store accepts it (255 chars)
    check_topic(dlq_topic(group), allow_dlq=True)  # consumers may subscribe to it
    for too_long in ("g" * (GROUP_MAX_LENGTH + 1), "g" * 255):
        with pytest.raises(RefusedError) as err:
            validate.group_name(too_long)  # the proxy and the broker agree
        assert err.value.code == Code.ILLEGAL_CONSUMER_GROUP
        with pytest.raises(RefusedError):
            check_group(too_long)


async def test_longest_names_retry_end_to_end(tmp_path) -> None:
    from popmq.broker.contract.types import AckEntry, Message, PopRequest
    from popmq.broker.names import GROUP_MAX_LENGTH, TOPIC_MAX_LENGTH
    from popmq.broker.testing import fast_broker_config, running_broker

    group, topic = "g" * GROUP_MAX_LENGTH, "t" * TOPIC_MAX_LENGTH
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.send([Message(topic, b"x")])
        await broker.pop(PopRequest(group, topic, invisible_time_ms=10, poll_time_ms=0))
        request = PopRequest(group, topic, invisible_time_ms=60_000, poll_time_ms=3000)
        (again,) = (await broker.pop(request)).messages
        assert again.delivery_attempt == 2
        await broker.ack(group, topic, [AckEntry(again.receipt_handle)])
