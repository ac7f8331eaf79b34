"""Topic and consumer-group name rules (RocketMQ's: ^[%|a-zA-Z0-9_-]+$, at most 127 chars)."""

from __future__ import annotations

import re

from popmq.broker.api.errors import BrokerError, Code
from popmq.broker.api.types import DLQ_PREFIX, RETRY_PREFIX, SYSTEM_PREFIX

MAX_NAME_LENGTH = 127
_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")
SYSTEM_TOPIC_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, SYSTEM_PREFIX)


def _name_problem(kind: str, name: str) -> str | None:
    if not name:
        return f"{kind} name is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"{kind} name {name[:40]!r}... is longer than {MAX_NAME_LENGTH} characters"
    if not _NAME.match(name):
        return f"{kind} name {name!r} may only hold letters, digits, '%', '|', '_' and '-'"
    return None


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_TOPIC_PREFIXES)


def check_topic(topic: str, *, user: bool = True) -> None:
    """ILLEGAL_TOPIC unless ``topic`` is a valid name; user topics may not use system prefixes."""
    problem = _name_problem("topic", topic)
    if problem is None and user and is_system_topic(topic):
        problem = f"topic name {topic!r} uses a reserved system prefix"
    if problem is not None:
        raise BrokerError(Code.ILLEGAL_TOPIC, problem)


def check_group(group: str) -> None:
    problem = _name_problem("consumer group", group)
    if problem is None and group.startswith("%"):
        problem = f"consumer group name {group!r} may not start with '%' (reserved)"
    if problem is not None:
        raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, problem)
