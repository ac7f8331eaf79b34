"""The one set of topic and consumer-group name rules (proxy, broker and store use these).

RocketMQ's rules are the base: names use ``[%|a-zA-Z0-9_-]`` (Validators.PATTERN), a topic has at
most 127 characters (TopicValidator.TOPIC_MAX_LENGTH) and a group at most 255
(Validators.CHARACTER_MAX_LENGTH). popmq also derives names from them, and every derived name
must itself be valid, because it becomes a directory name in the store (255 bytes at most on
every common filesystem):

- ``%RETRY%{group}+{topic}``: a group's POP retry topic (RocketMQ 5's V2 form). ``+`` is not
  allowed in names, so the mapping is injective (the V1 form ``%RETRY%{group}_{topic}`` was not:
  ``a_b``/``c`` and ``a``/``b_c`` met);
- ``%DLQ%{group}``: a group's dead-letter topic, which consumers may subscribe to;
- ``%SYS%...``: the broker's own topics (timer), fixed names.

So a group has at most 255 - len("%RETRY%+") - 127 = 120 characters: the longest group on the
longest topic gives a 255-character retry topic, and its DLQ topic (125) is a valid topic too.
"""

from __future__ import annotations

import re
from typing import Any

from popmq.broker.contract.errors import Code, RefusedError

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_PREFIX = "%SYS%"
SYSTEM_TOPIC_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, SYSTEM_PREFIX)
# RocketMQ 5 KeyBuilder's V2 separator: illegal in user names, so it splits unambiguously.
RETRY_SEPARATOR = "+"
LEGACY_RETRY_SEPARATOR = "_"

TOPIC_MAX_LENGTH = 127
INTERNAL_NAME_MAX_LENGTH = 255
GROUP_MAX_LENGTH = (
    INTERNAL_NAME_MAX_LENGTH - len(RETRY_PREFIX) - len(RETRY_SEPARATOR) - TOPIC_MAX_LENGTH
)
_NAME = re.compile(r"[%|a-zA-Z0-9_-]+")
# Names the broker makes itself may also hold the retry separator.
_INTERNAL_NAME = re.compile(rf"[%|a-zA-Z0-9_+-]{{1,{INTERNAL_NAME_MAX_LENGTH}}}")


def retry_topic(group: str, topic: str) -> str:
    """The POP retry topic of a group on a topic: ``%RETRY%group+topic`` (RocketMQ 5 V2)."""
    return f"{RETRY_PREFIX}{group}{RETRY_SEPARATOR}{topic}"


def legacy_retry_topic(group: str, topic: str) -> str:
    """The retry topic name popmq used before (``%RETRY%group_topic``, RocketMQ's V1). Data
    written there before an upgrade is still read; nothing new is written there."""
    return f"{RETRY_PREFIX}{group}{LEGACY_RETRY_SEPARATOR}{topic}"


def parse_retry_topic(name: str) -> tuple[str, str] | None:
    """(group, topic) of a V2 retry topic name, or None if ``name`` is not one."""
    if not name.startswith(RETRY_PREFIX) or RETRY_SEPARATOR not in name:
        return None
    group, _, topic = name[len(RETRY_PREFIX) :].partition(RETRY_SEPARATOR)
    return group, topic


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_TOPIC_PREFIXES)


def topic_problem(name: object, *, allow_dlq: bool = False, user: bool = True) -> str | None:
    """Why ``name`` is not an acceptable topic, or None. ``user`` topics (what clients name)
    may not be system topics, except DLQ topics where ``allow_dlq`` (consumers read them)."""
    if not isinstance(name, str) or not name or not name.strip():
        return "topic name is empty"
    if not user:
        if not _INTERNAL_NAME.fullmatch(name):
            return (
                f"topic name {name[:40]!r} must be 1..{INTERNAL_NAME_MAX_LENGTH} of the "
                "characters a-z A-Z 0-9 _ - % | +"
            )
        return None
    if len(name) > TOPIC_MAX_LENGTH:
        return f"topic name {name[:40]!r}... is longer than {TOPIC_MAX_LENGTH} characters"
    if not _NAME.fullmatch(name):
        return f"topic name {name!r} may only hold letters, digits, '%', '|', '_' and '-'"
    if name.startswith((SYSTEM_PREFIX, RETRY_PREFIX)) or (
        name.startswith(DLQ_PREFIX) and not allow_dlq
    ):
        return f"topic name {name!r} uses a reserved system prefix"
    return None


def group_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name or not name.strip():
        return "consumer group name is empty"
    if len(name) > GROUP_MAX_LENGTH:
        return (
            f"consumer group name {name[:40]!r}... is longer than {GROUP_MAX_LENGTH} characters "
            f"(its retry topic %RETRY%group+topic must fit {INTERNAL_NAME_MAX_LENGTH})"
        )
    if not _NAME.fullmatch(name):
        return f"consumer group name {name!r} may only hold letters, digits, '%', '|', '_' and '-'"
    if name.startswith("%"):  # %SYS%, %RETRY%, %DLQ%...: reserved for system names
        return f"consumer group name {name!r} may not start with '%' (reserved)"
    return None


# Names already found acceptable, by how they were checked: a message's topic is checked at
# the proxy's edge and again in its broker, per message (several µs each with the regular
# expression). Only accepted names are kept, at most _ACCEPTED_MAX (then forgotten at once),
# so a client making up names gains nothing and costs a bounded set.
_ACCEPTED_MAX = 4096
_accepted_topics: set[tuple[str, bool, bool]] = set()
_accepted_groups: set[str] = set()


def _accept(accepted: set[Any], key: Any) -> None:
    if len(accepted) >= _ACCEPTED_MAX:
        accepted.clear()
    accepted.add(key)


def check_topic(topic: str, *, user: bool = True, allow_dlq: bool = False) -> str:
    """ILLEGAL_TOPIC unless ``topic`` is acceptable (see ``topic_problem``)."""
    key = (topic, user, allow_dlq)
    if type(topic) is str and key in _accepted_topics:
        return topic
    problem = topic_problem(topic, user=user, allow_dlq=allow_dlq)
    if problem is not None:
        raise RefusedError(Code.ILLEGAL_TOPIC, problem)
    _accept(_accepted_topics, key)
    return topic


def check_group(group: str) -> str:
    if type(group) is str and group in _accepted_groups:
        return group
    problem = group_problem(group)
    if problem is not None:
        raise RefusedError(Code.ILLEGAL_CONSUMER_GROUP, problem)
    _accept(_accepted_groups, group)
    return group
