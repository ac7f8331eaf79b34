import pytest
from popmq.broker.api.errors import BrokerError, Code
from popmq.broker.pop.names import check_group, check_topic


@pytest.mark.parametrize("name", ["orders", "a-b_c|d%e", "x" * 127])
def test_valid_topics(name: str) -> None:
    check_topic(name, user=not name.startswith("%"))


@pytest.mark.parametrize("name", ["", "x" * 128, "a b", "a/b", "t.opic", "%RETRY%g_t", "%DLQ%g"])
def test_illegal_user_topics(name: str) -> None:
    with pytest.raises(BrokerError) as err:
        check_topic(name)
    assert err.value.code == Code.ILLEGAL_TOPIC


def test_system_topic_allowed_for_internal_use() -> None:
    check_topic("%RETRY%g_t", user=False)


@pytest.mark.parametrize("name", ["", "g" * 128, "g 1", "%SYS%x", "g$"])
def test_illegal_groups(name: str) -> None:
    with pytest.raises(BrokerError) as err:
        check_group(name)
    assert err.value.code == Code.ILLEGAL_CONSUMER_GROUP
