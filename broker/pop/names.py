"""Name rules for the POP engine: the shared ones of ``popmq.broker.names``."""

from __future__ import annotations

from popmq.broker.names import (
    GROUP_MAX_LENGTH,
    SYSTEM_TOPIC_PREFIXES,
    TOPIC_MAX_LENGTH,
    check_group,
    check_topic,
    is_system_topic,
)

MAX_NAME_LENGTH = TOPIC_MAX_LENGTH

__all__ = [
    "GROUP_MAX_LENGTH",
    "MAX_NAME_LENGTH",
    "SYSTEM_TOPIC_PREFIXES",
    "TOPIC_MAX_LENGTH",
    "check_group",
    "check_topic",
    "is_system_topic",
]
