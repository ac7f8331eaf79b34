"""The data behind every page, as JSON-ready dicts: the JSON API returns them as they are and
the pages render them, so a page never shows what the API would not.

Each view reads or writes through an Asker: an admin's calls are signed with its own keys; a
non-admin reads through the console's keys, filtered to what its grants reach, and may not
write.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from prometheus_client.parser import text_string_to_metric_families

from popmq.console.admin_client import AdminClient, ConsoleError, Credentials
from popmq.console.identity import Identity
from popmq.pb.admin.v1 import admin_pb2 as a

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
RATE_WINDOW_S = 600.0  # the /cluster charts' span


@dataclass(frozen=True)
class Asker:
    client: AdminClient
    identity: Identity
    reader: Credentials | None  # the console's own admin keys, for non-admins' reads

    async def read(self, method: str, request: Any) -> Any:
        if self.identity.admin:
            return await self.client.call(method, request, self.identity.credentials)
        if self.reader is None:
            raise ConsoleError(
                403, "FORBIDDEN", f"access key {self.identity.access_key!r} is not an admin, and "
                "this console has no keys of its own to read for it (popmq console --access-key)",
            )  # fmt: skip
        return await self.client.call(method, request, self.reader)

    async def read_clients(self, group: str = "") -> tuple[str, list[Any]]:
        """ListClients, following its pages: the proxy that answered, and every client."""
        request = a.ListClientsRequest(group=group)
        found: list[Any] = []
        while True:
            page = await self.read("ListClients", request)
            found += page.clients
            if not page.next_page_token:
                return page.proxy, found
            request.page_token = page.next_page_token

    async def write(self, method: str, request: Any) -> Any:
        if not self.identity.admin:
            raise ConsoleError(
                403, "FORBIDDEN", f"access key {self.identity.access_key!r} may not {method}: "
                "needs admin",
            )  # fmt: skip
        return await self.client.call(method, request, self.identity.credentials)

    def need_topic(self, topic: str) -> None:
        if not self.identity.can_read_topic(topic):
            raise ConsoleError(403, "FORBIDDEN", f"no grant reaches topic {topic!r}")

    def need_group(self, group: str) -> None:
        if not self.identity.can_see_group(group):
            raise ConsoleError(403, "FORBIDDEN", f"no grant reaches group {group!r}")


INT32 = (-(2**31), 2**31 - 1)  # what the admin requests' numbers hold


def int32(name: str, value: int) -> int:
    """A number from the user that goes into an admin request: 400 if it cannot (protobuf
    would raise ValueError, a 500 and a traceback)."""
    if not INT32[0] <= value <= INT32[1]:
        raise ConsoleError(400, "BAD_REQUEST", f"{name} {value} is out of range")
    return value


def plain(message: Any) -> dict[str, Any]:
    """A protobuf message as a dict with every field, numbers as numbers (MessageToDict drops
    zero values and writes 64-bit numbers as strings); bytes as base64."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.is_repeated:
            out[field.name] = [_one(field, v) for v in value]
        else:
            out[field.name] = _one(field, value)
    out.pop("status", None)
    return out


def _one(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return plain(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


# -- cluster -----------------------------------------------------------------------------------


class Rates:
    """Messages in and out per second, from the proxy's counters sampled at each /cluster
    request (the page refreshes itself every few seconds while it is open)."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=2000)

    def add(self, now: float, sent: float, delivered: float) -> None:
        if self._samples and (sent < self._samples[-1][1] or delivered < self._samples[-1][2]):
            self._samples.clear()  # the proxy restarted: its counters began again
        self._samples.append((now, sent, delivered))
        while self._samples and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()

    def series(self) -> dict[str, list[list[float]]]:
        points: dict[str, list[list[float]]] = {"in": [], "out": []}
        samples = list(self._samples)
        for (t0, s0, d0), (t1, s1, d1) in itertools.pairwise(samples):
            if t1 - t0 <= 0:
                continue
            points["in"].append([round(t1, 3), round(max(s1 - s0, 0) / (t1 - t0), 3)])
            points["out"].append([round(t1, 3), round(max(d1 - d0, 0) / (t1 - t0), 3)])
        return points


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(
        v for n, ls, v in samples if n == name and all(ls.get(k) == x for k, x in labels.items())
    )


async def cluster(ask: Asker, rates: Rates) -> dict[str, Any]:
    status = await ask.read("ClusterStatus", a.ClusterStatusRequest())
    stats = metric_samples((await ask.read("Stats", a.StatsRequest())).prometheus_text)
    sent = _total(stats, "popmq_proxy_rpc_requests_total", method="SendTestMessage", code="OK")
    delivered = _total(stats, "popmq_proxy_messages_delivered_total")
    rates.add(time.time(), sent, delivered)
    out = plain(status)
    out["proxies"] = [{"endpoint": status.proxy, "version": status.version,
                       "clients": status.clients}]  # fmt: skip
    out["sent_total"], out["delivered_total"] = sent, delivered
    out["rates"] = rates.series()
    return out


# -- topics ------------------------------------------------------------------------------------


def _topic_row(topic: Any) -> dict[str, Any]:
    return {
        "name": topic.name,
        "brokers": [b.broker for b in topic.brokers],
        "queues": sum(b.queue_count for b in topic.brokers),
        "messages": sum(q.max_offset - q.min_offset for b in topic.brokers for q in b.queues),
    }


async def topics(ask: Asker, include_system: bool = False) -> dict[str, Any]:
    response = await ask.read("ListTopics", a.ListTopicsRequest(include_system=include_system))
    rows = [_topic_row(t) for t in response.topics if ask.identity.can_read_topic(t.name)]
    return {"topics": rows}


async def topic(ask: Asker, name: str) -> dict[str, Any]:
    ask.need_topic(name)
    described = await ask.read("DescribeTopic", a.DescribeTopicRequest(name=name))
    route = await ask.read("TopicRoute", a.TopicRouteRequest(topic=name))
    out = _topic_row(described.topic)
    out["queue_offsets"] = [
        {"broker": b.broker, **plain(q)} for b in described.topic.brokers for q in b.queues
    ]
    out["route"] = plain(route)
    return out


async def create_topic(ask: Asker, name: str, queues: int) -> dict[str, Any]:
    response = await ask.write("CreateTopic", a.CreateTopicRequest(name=name, queue_count=queues))
    return _topic_row(response.topic)


# -- groups ------------------------------------------------------------------------------------


def _progress(queues: Any) -> dict[str, int]:
    lag = sum(q.lag for q in queues if not q.topic.startswith(RETRY_PREFIX))
    retry = sum(q.lag for q in queues if q.topic.startswith(RETRY_PREFIX))
    return {
        "lag": lag,
        "retry_lag": retry,
        "inflight": sum(q.inflight for q in queues),
        "max_lag_latency_ms": max((q.lag_latency_ms for q in queues), default=0),
    }


async def groups(ask: Asker) -> dict[str, Any]:
    listed = await ask.read("ListGroups", a.ListGroupsRequest())
    online: dict[str, int] = {}
    for c in (await ask.read_clients())[1]:
        if c.group:
            online[c.group] = online.get(c.group, 0) + 1
    rows = []
    for summary in listed.groups:
        name = summary.group.name
        if not ask.identity.can_see_group(name):
            continue
        progress = await ask.read("ConsumerProgress", a.ConsumerProgressRequest(group=name))
        dlq = await ask.read("ListDlq", a.ListDlqRequest(group=name, limit=1))
        rows.append({
            **plain(summary.group), "brokers": list(summary.brokers),
            **_progress([q for q in progress.queues if ask.identity.can_read_topic(q.topic)]),
            "inflight": summary.inflight,
            "dlq": dlq.total, "online_clients": online.get(name, 0),
        })  # fmt: skip
    return {"groups": rows}


async def group(ask: Asker, name: str) -> dict[str, Any]:
    ask.need_group(name)
    settings = await ask.read("GetGroup", a.GetGroupRequest(name=name))
    progress = await ask.read("ConsumerProgress", a.ConsumerProgressRequest(group=name))
    _, clients = await ask.read_clients(name)
    # A grant on a group may cover only some of its topics: the others' progress (names,
    # offsets, lags) is another user's (a retry topic goes with its topic).
    queues = [q for q in progress.queues if ask.identity.can_read_topic(q.topic)]
    return {
        **plain(settings.group), **_progress(queues),
        "queues": [plain(q) for q in queues],
        "clients": [_client_row(ask.identity, c) for c in clients],
    }  # fmt: skip


def parse_time_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConsoleError(
            400, "BAD_REQUEST", f"bad time {text!r}: use ISO 8601, e.g. 2026-11-23T10:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


async def reset_offset(ask: Asker, group: str, topic: str, to: str) -> dict[str, Any]:
    """to: "earliest", "latest" or an ISO 8601 time (no zone: UTC)."""
    request = a.ResetOffsetRequest(group=group, topic=topic)
    if to == "earliest":
        request.earliest = True
    elif to == "latest":
        request.latest = True
    else:
        request.timestamp_ms = parse_time_ms(to)
    response = await ask.write("ResetOffset", request)
    return {"group": group, "topic": topic, "queues": [plain(q) for q in response.queues]}


# -- messages ----------------------------------------------------------------------------------


def render_body(body: bytes, form: str) -> str:
    """The body as text, pretty JSON or hex (text when it does not decode: replacement marks)."""
    if form == "hex":
        return " ".join(body[i : i + 16].hex(" ") for i in range(0, len(body), 16))
    text = body.decode(errors="replace")
    if form == "json":
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            return text
    return text


def _message(view: Any) -> dict[str, Any]:
    out = plain(view)
    out["body_text"] = view.body.decode(errors="replace")
    return out


async def find_messages(
    ask: Asker,
    *,
    topic: str = "",
    message_id: str = "",
    key: str = "",
    since: str = "",
    until: str = "",
    limit: int = 32,
) -> dict[str, Any]:
    """By id, key or store-time range (`since`/`until`: ISO 8601; no zone: UTC)."""
    if not (message_id or key or since or until):
        raise ConsoleError(400, "BAD_REQUEST", "give a message id, a key or a time range")
    if topic:
        ask.need_topic(topic)
    request = a.QueryMessagesRequest(
        topic=topic, message_id=message_id, key=key, limit=limit, include_body=True,
        start_ms=parse_time_ms(since) if since else 0,
        end_ms=parse_time_ms(until) if until else 0,
    )  # fmt: skip
    response = await ask.read("QueryMessages", request)
    found = [_message(m) for m in response.messages if ask.identity.can_read_topic(m.topic)]
    return {"messages": found, "truncated": response.truncated}


async def send_message(
    ask: Asker, topic: str, body: bytes, tag: str = "", keys: list[str] | None = None
) -> dict[str, Any]:
    request = a.SendTestMessageRequest(topic=topic, body=body, tag=tag, keys=keys or [])
    response = await ask.write("SendTestMessage", request)
    return plain(response.message)


# -- dead letters ------------------------------------------------------------------------------


async def dlq(ask: Asker, group: str, limit: int = 100) -> dict[str, Any]:
    ask.need_group(group)
    if not ask.identity.can_read_topic(f"{DLQ_PREFIX}{group}"):
        raise ConsoleError(403, "FORBIDDEN", f"no grant reaches {DLQ_PREFIX}{group}")
    response = await ask.read("ListDlq", a.ListDlqRequest(group=group, limit=limit))
    return {"group": group, "total": response.total,
            "messages": [plain(m) for m in response.messages]}  # fmt: skip


async def resend_dlq(
    ask: Asker, group: str, message_ids: list[str], all_messages: bool
) -> dict[str, Any]:
    request = a.ResendDlqRequest(group=group, message_ids=message_ids, all=all_messages)
    response = await ask.write("ResendDlq", request)
    return {"group": group, "resent": [plain(m) for m in response.resent]}


# -- clients and long polling ------------------------------------------------------------------


async def clients(ask: Asker) -> dict[str, Any]:
    proxy, found = await ask.read_clients()
    identity = ask.identity
    rows = [
        _client_row(identity, c)
        for c in found
        if identity.admin
        or (c.group and identity.can_see_group(c.group))
        or (c.topics and all(identity.can_read_topic(t) for t in c.topics))
    ]
    return {"proxy": proxy, "clients": rows}


def _client_row(identity: Identity, client: Any) -> dict[str, Any]:
    """A client as a user may see it: a non-admin sees only the topics its grants reach (a
    client of a group it may see can also consume another user's topics)."""
    row = plain(client)
    if not identity.admin:
        row["topics"] = [t for t in client.topics if identity.can_read_topic(t)]
    return row


# What /longpoll shows of the proxy's metrics (labels kept: strategy, mode, broker).
LONGPOLL_METRICS = (
    "popmq_proxy_long_polls_total",
    "popmq_proxy_first_pop_hits_total",
    "popmq_proxy_empty_responses_total",
    "popmq_proxy_false_empty_responses_total",
    "popmq_proxy_pop_with_notify_total",
    "popmq_proxy_active_long_polls",
    "popmq_proxy_held_notification_tasks",
    "popmq_proxy_adaptive_mode",
    "popmq_proxy_adaptive_switches_total",
    "popmq_proxy_pop_request_rate",
    "popmq_proxy_broker_link_watches",
)


async def longpoll(ask: Asker) -> dict[str, Any]:
    stats = metric_samples((await ask.read("Stats", a.StatsRequest())).prometheus_text)
    rows = [{"metric": n, "labels": ls, "value": v} for n, ls, v in stats if n in LONGPOLL_METRICS]
    modes = [ls.get("mode", "") for n, ls, v in stats if n == "popmq_proxy_adaptive_mode" and v]
    strategies = sorted(
        {ls["strategy"] for n, ls, _ in stats if n == "popmq_proxy_long_polls_total"}
    )
    return {
        "strategies": strategies,
        "adaptive_mode": modes[0] if modes else "",
        "held_polls": _total(stats, "popmq_proxy_active_long_polls"),
        "notify_tasks": _total(stats, "popmq_proxy_held_notification_tasks"),
        "watches": _total(stats, "popmq_proxy_broker_link_watches"),
        "metrics": rows,
    }
