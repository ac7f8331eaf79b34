"""The ACL: users (access key + secret key) and what each may do.

File format (``--acl FILE``)::

    users:
      - access_key: app1
        secret_key: s3cr3t
        allow:
          - publish: orders            # a topic, or a pattern such as orders-*
          - subscribe: billing         # a group, on any topic
          - subscribe: {group: audit, topics: [orders, payments-*]}
      - access_key: ops
        secret_key: ...
        admin: true                    # the admin API (and every topic and group)

Patterns: ``*`` matches any run of characters; nothing else is special. Deny by default.

Namespaces: a grant reaches the resources of one namespace, ``namespace: prod`` (RocketMQ's
``x-mq-namespace``), or, left out, only un-namespaced ones. Behind the proxy's edge a
namespaced name is ``prod%orders``; a grant's patterns are matched against the name inside its
namespace (``orders``), so no ``*`` ever reaches across the ``%`` into a namespace::

          - publish: "orders-*"
            namespace: prod            # prod's orders-*, and nothing outside prod

Topics the broker derives from a group (``%RETRY%group+topic``, ``%DLQ%group``) hold that
group's messages, so, as RocketMQ ACL 2.0 authorizes a retry topic as its group, they belong
to the group: consuming as the group covers them as far as the grant's topics reach (a retry
topic with its topic; the dead letters, which come from every topic the group consumed, with
a grant on any topic), and no other grant does unless it names them (a pattern that starts
with ``%DLQ%``/``%RETRY%``/``%SYS%``). A group-wide ``subscribe: billing`` or ``publish: "*"``
never reaches another group's retry or dead letters, nor ``{group: "*", topics: [orders]}``
the dead letters of a group that also consumed other topics.
Secret keys are held as SecretStr: they never appear in a repr, a log line or an answer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

log = logging.getLogger(__name__)
_RELOAD_EVERY_S = 1.0
# Subscribe decisions a User remembers (one per group and topic it consumes).
_DECISIONS_KEPT = 1024
# The broker's derived topics (popmq.broker.names; this layer sits below the broker).
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_PREFIX = "%SYS%"
SYSTEM_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, SYSTEM_PREFIX)
_RETRY_SEPARATOR = "+"


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(
        "".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern))
    )


def matches(pattern: str, name: str) -> bool:
    """Does a name match a pattern where ``*`` is the only wildcard?"""
    if "*" not in pattern:
        return pattern == name
    return _compile(pattern).fullmatch(name) is not None


def _system_prefix(topic: str) -> str | None:
    return next((p for p in SYSTEM_PREFIXES if topic.startswith(p)), None)


def owning_group(topic: str) -> str | None:
    """The group whose messages a derived topic holds: ``%DLQ%g`` and ``%RETRY%g+t`` are g's.
    None for other topics (and for the ambiguous legacy ``%RETRY%g_t``: only named grants)."""
    if topic.startswith(DLQ_PREFIX):
        return topic[len(DLQ_PREFIX) :] or None
    if topic.startswith(RETRY_PREFIX) and _RETRY_SEPARATOR in topic:
        return topic[len(RETRY_PREFIX) :].partition(_RETRY_SEPARATOR)[0] or None
    return None


NAMESPACE_SEPARATOR = "%"  # RocketMQ's NamespaceUtil form: NAMESPACE%name
# RocketMQ's namespace rule, as the proxy's edge checks x-mq-namespace (proxy/grpc/namespace.py).
_NAMESPACE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NAMESPACE_RULE = (
    "a namespace is a name, not a pattern: 1 to 64 characters, each a letter, a digit, "
    "'_' or '-' (no '*', no '%'); leave `namespace` out for resources outside any namespace"
)


def _plain_in_namespace(name: str, namespace: str) -> str | None:
    """A plain name seen from ``namespace``: ``prod%orders`` is ``orders`` in prod, ``orders``
    is ``orders`` outside any namespace ("" ), anything else is not there (None)."""
    if not namespace:
        return None if NAMESPACE_SEPARATOR in name else name
    own, sep, rest = name.partition(NAMESPACE_SEPARATOR)
    if not sep or own != namespace or not rest or NAMESPACE_SEPARATOR in rest:
        return None
    return rest


def in_namespace(name: str, namespace: str) -> str | None:
    """The name a grant of ``namespace`` sees, or None when ``name`` is not in it.

    Derived names keep their prefix and lose the namespace of each part: ``%DLQ%prod%billing``
    is ``%DLQ%billing`` in prod, ``%RETRY%prod%g+prod%t`` is ``%RETRY%g+t``; a retry topic whose
    group and topic lie in different namespaces is in none."""
    if name.startswith(DLQ_PREFIX):
        inner = _plain_in_namespace(name[len(DLQ_PREFIX) :], namespace)
        return None if inner is None else DLQ_PREFIX + inner
    if name.startswith(RETRY_PREFIX):
        rest = name[len(RETRY_PREFIX) :]
        if _RETRY_SEPARATOR not in rest:  # the legacy %RETRY%g_t: as one plain name
            inner = _plain_in_namespace(rest, namespace)
            return None if inner is None else RETRY_PREFIX + inner
        group, _, topic = rest.partition(_RETRY_SEPARATOR)
        local_group = _plain_in_namespace(group, namespace)
        local_topic = in_namespace(topic, namespace)
        if local_group is None or local_topic is None:
            return None
        return f"{RETRY_PREFIX}{local_group}{_RETRY_SEPARATOR}{local_topic}"
    if name.startswith(SYSTEM_PREFIX):
        inner = _plain_in_namespace(name[len(SYSTEM_PREFIX) :], namespace)
        return None if inner is None else SYSTEM_PREFIX + inner
    return _plain_in_namespace(name, namespace)


def topic_pattern_covers(pattern: str, topic: str) -> bool:
    """A topic pattern's reach: a derived topic (``%DLQ%...``, ``%RETRY%...``, ``%SYS%...``) only
    by a pattern that names its prefix, so ``*`` or ``orders*`` never cover another group's
    retry topics or dead letters."""
    prefix = _system_prefix(topic)
    if prefix is not None and not pattern.startswith(prefix):
        return False
    return matches(pattern, topic)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Subscription(_Strict):
    group: str = Field(min_length=1)
    topics: tuple[str, ...] | None = None  # None (left out): any topic

    @model_validator(mode="before")
    @classmethod
    def _no_null_topics(cls, data: Any) -> Any:
        # `topics:` with no value (a typo, or a file read while half-written) is not "any".
        if isinstance(data, dict) and "topics" in data and data["topics"] is None:
            raise ValueError("topics is empty: list topics, or leave it out for any topic")
        return data

    def covers(self, group: str, topic: str | None) -> bool:
        """Consuming as ``group`` on ``topic``: the group's own retry and dead-letter topics
        come with the group (see _reaches_derived); any other topic must be in ``topics``
        (left out: any user topic)."""
        if not matches(self.group, group):
            return False
        if topic is None:
            return True
        return self._reaches_derived(topic, lambda owner: owner == group) or self._topics_cover(
            topic
        )

    def covers_topic(self, topic: str) -> bool:
        """Seeing a topic's route or offsets: a topic this grant could consume."""
        return self._reaches_derived(
            topic, lambda owner: matches(self.group, owner)
        ) or self._topics_cover(topic)

    def _reaches_derived(self, topic: str, is_own: Callable[[str], bool]) -> bool:
        """A derived topic of a group this grant consumes as, no further than its topics:
        ``%RETRY%g+t`` holds t's messages (so: when t is covered), ``%DLQ%g`` those of every
        topic g consumed, whoever's grant it consumed them under (so: only with any topic)."""
        owner = owning_group(topic)
        if owner is None or not is_own(owner):
            return False
        if topic.startswith(DLQ_PREFIX):
            return self.topics is None
        base = topic[len(RETRY_PREFIX) :].partition(_RETRY_SEPARATOR)[2]
        if not base:
            return False
        return self._reaches_derived(base, is_own) or self._topics_cover(base)

    def _topics_cover(self, topic: str) -> bool:
        if self.topics is None:
            return _system_prefix(topic) is None
        return any(topic_pattern_covers(p, topic) for p in self.topics)


class Grant(_Strict):
    """One ``allow`` entry: exactly one of publish or subscribe, in one namespace (None: only
    resources outside any namespace)."""

    publish: str | None = None
    subscribe: Subscription | None = None
    namespace: str | None = None

    @field_validator("namespace", mode="before")
    @classmethod
    def _namespace_name(cls, value: Any) -> Any:
        # Before pydantic's own checks: its message would be the raw regular expression.
        if value is not None and not (isinstance(value, str) and _NAMESPACE.fullmatch(value)):
            raise ValueError(_NAMESPACE_RULE)
        return value

    @field_validator("subscribe", mode="before")
    @classmethod
    def _group_shorthand(cls, value: Any) -> Any:
        return {"group": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one(self) -> Grant:
        if (self.publish is None) == (self.subscribe is None):
            raise ValueError("an allow entry is either `publish: TOPIC` or `subscribe: GROUP`")
        names = [self.publish] if self.publish is not None else []
        if self.subscribe is not None:
            names += [self.subscribe.group, *(self.subscribe.topics or ())]
        for name in names:
            # `prod%orders` or `prod*` meant a namespace: say how to grant one instead.
            prefix = _system_prefix(name) or ""
            if NAMESPACE_SEPARATOR in name.removeprefix(prefix):
                raise ValueError(
                    f"{name!r}: a grant names resources inside one namespace; write "
                    "`namespace: NS` beside it and the names without `NS%`"
                )
        return self

    def localize(self, name: str) -> str | None:
        """``name`` as this grant's patterns see it, or None if it lies outside its namespace."""
        return in_namespace(name, self.namespace or "")

    def may_publish(self, topic: str) -> bool:
        if self.publish is None:
            return False
        local = self.localize(topic)
        return local is not None and topic_pattern_covers(self.publish, local)

    def may_subscribe(self, group: str, topic: str | None) -> bool:
        if self.subscribe is None:
            return False
        local_group = self.localize(group)
        local_topic = None if topic is None else self.localize(topic)
        if local_group is None or (topic is not None and local_topic is None):
            return False
        return self.subscribe.covers(local_group, local_topic)

    def may_read_topic(self, topic: str) -> bool:
        if self.may_publish(topic):
            return True
        local = self.localize(topic)
        return (
            self.subscribe is not None and local is not None and self.subscribe.covers_topic(local)
        )


class User(_Strict):
    access_key: str = Field(min_length=1, pattern=r"^[^\s,=]+$")
    secret_key: SecretStr
    admin: bool = False
    allow: tuple[Grant, ...] = ()

    @field_validator("secret_key")
    @classmethod
    def _not_empty(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 1:
            raise ValueError("secret_key must not be empty")
        return value

    def can_publish(self, topic: str) -> bool:
        return self.admin or any(g.may_publish(topic) for g in self.allow)

    def can_subscribe(self, group: str, topic: str | None = None) -> bool:
        # Asked by every consuming call (a walk of the grants' patterns: about 5% of an idle
        # receive's Python): remembered per (group, topic) by this User, whose grants never
        # change (a reload makes new Users). Bounded: made-up names only evict. The caller
        # is signed in already, and its answer says the same as the time it took.
        memo: dict[tuple[str, str | None], bool] | None = self.__dict__.get("_subscribe_memo")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_subscribe_memo", memo)  # frozen model: a private cache
        key = (group, topic)
        known = memo.get(key)
        if known is None:
            if len(memo) >= _DECISIONS_KEPT:
                memo.clear()
            known = memo[key] = self.admin or any(g.may_subscribe(group, topic) for g in self.allow)
        return known

    def can_read_topic(self, topic: str) -> bool:
        """May see a topic's route or offsets: publishes to it or subscribes on it."""
        return self.admin or any(g.may_read_topic(topic) for g in self.allow)


class Acl(_Strict):
    users: tuple[User, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Acl:
        seen: set[str] = set()
        for user in self.users:
            if user.access_key in seen:
                raise ValueError(f"access key {user.access_key!r} appears twice")
            seen.add(user.access_key)
        return self

    def user(self, access_key: str) -> User | None:
        return self._index().get(access_key)

    def _index(self) -> dict[str, User]:
        index = self.__dict__.get("_by_key")
        if index is None:
            index = {u.access_key: u for u in self.users}
            object.__setattr__(self, "_by_key", index)  # frozen model: a private cache
        return index


def load_acl(path: str | Path) -> Acl:
    """Read and validate an ACL file; ValueError names the file and the problem."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read ACL file {path}: {exc}") from None
    if data is None:  # an empty file (or one read while being rewritten): not "no users"
        raise ValueError(f"bad ACL file {path}: the file is empty (write `users: []` for none)")
    try:
        return Acl.model_validate(data)
    except ValidationError as exc:
        # Where and what, never the input values: they may hold secret keys.
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'file'}: "
            f"{error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        raise ValueError(f"bad ACL file {path}: {problems}") from None


class AclFile:
    """An ACL file, re-read when it changes (a Kubernetes Secret update, an edit), checked at
    most once a second. A file that no longer parses keeps the last good ACL and logs an ERROR
    (never the secrets): a typo must not lock every client out or open the doors."""

    def __init__(
        self,
        path: str | Path,
        clock: Callable[[], float] = time.monotonic,
        on_reload_failure: Callable[[], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._on_reload_failure = on_reload_failure
        self._mtime = self._stat()
        self.acl = load_acl(self.path)
        self._checked = clock()
        self.reload_failures = 0

    def _stat(self) -> tuple[int, int, int] | None:
        """mtime, inode and size: a Secret update swaps a symlink, an editor may replace."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    def current(self) -> Acl:
        now = self._clock()
        if now - self._checked >= _RELOAD_EVERY_S:
            self._checked = now
            mtime = self._stat()
            if mtime != self._mtime:
                self._mtime = mtime
                try:
                    self.acl = load_acl(self.path)
                    log.info("ACL reloaded from %s: %d users", self.path, len(self.acl.users))
                except ValueError as exc:
                    self.reload_failures += 1
                    log.error("keeping the previous ACL: %s", exc)
                    if self._on_reload_failure is not None:
                        self._on_reload_failure()
        return self.acl
