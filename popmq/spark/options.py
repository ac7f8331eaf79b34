"""The connector's options: parsed once on the driver into frozen, picklable settings.

Spark hands options over as a case-insensitive dict of strings. Every mistake the user can
make here raises OptionError with the option's name and what a good value looks like, before
any Spark job starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from popmq.client.codec import parse_endpoint
from popmq.client.security import ClientSecurity
from popmq.errors import Code, PopmqError


class OptionError(PopmqError, ValueError):
    """A bad or missing option of format("popmq")."""

    code = Code.BAD_REQUEST

    def __init__(self, message: str) -> None:
        super().__init__(f"popmq: {message}")


# Per-queue JSON offsets use Kafka's sentinels for "the first" and "the next" offset.
EARLIEST_SENTINEL = -2
LATEST_SENTINEL = -1

_EXAMPLE_JSON = '{"broker-a": {"0": 42, "1": -2}}'
_OFFSETS_HELP = (
    "use 'earliest', 'latest', per-queue JSON like "
    f"{_EXAMPLE_JSON} (-2 = earliest, -1 = latest), or a timestamp "
    "('timestamp:1700000000000' in epoch milliseconds, or ISO-8601 like '2024-05-01T12:00:00Z')"
)


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends: a policy for every queue, or explicit per-queue offsets."""

    # json: per-queue offsets; timestamps: per-queue timestamps (startingOffsetsByTimestamp)
    kind: Literal["earliest", "latest", "timestamp", "json", "timestamps"]
    timestamp_ms: int | None = None
    # broker -> queue id -> offset (or a sentinel); sorted tuples so the spec stays hashable.
    per_queue: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()

    def queue_offsets(self) -> dict[tuple[str, int], int]:
        return {(b, q): o for b, queues in self.per_queue for q, o in queues}


def parse_offset_spec(name: str, text: str) -> OffsetSpec:
    value = text.strip()
    lowered = value.lower()
    if lowered in ("earliest", "latest"):
        return OffsetSpec(kind=lowered)  # type: ignore[arg-type]
    if value.startswith("{"):
        return _parse_offsets_json(name, value)
    if lowered.startswith("timestamp:"):
        digits = value.split(":", 1)[1].strip()
        if not digits.lstrip("-").isdigit() or int(digits) < 0:
            raise OptionError(f"{name}={text!r}: the timestamp must be epoch milliseconds >= 0")
        return OffsetSpec(kind="timestamp", timestamp_ms=int(digits))
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(f"{name}={text!r} is not understood: {_OFFSETS_HELP}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a bare date-time is read as UTC, like Spark's
    return OffsetSpec(kind="timestamp", timestamp_ms=int(moment.timestamp() * 1000))


def _parse_offsets_json(name: str, text: str) -> OffsetSpec:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(f"{name} is not valid JSON ({error}); {_OFFSETS_HELP}") from None
    if not isinstance(data, dict) or not data:
        raise OptionError(f"{name} must be a non-empty JSON object like {_EXAMPLE_JSON}")
    per_queue = []
    for broker, queues in sorted(data.items()):
        if not isinstance(queues, dict):
            raise OptionError(
                f"{name}: the value for broker {broker!r} must be an object of queue id -> "
                f"offset, like {_EXAMPLE_JSON}"
            )
        parsed = []
        for queue_id, offset in sorted(queues.items()):
            if not str(queue_id).isdigit():
                raise OptionError(f"{name}: queue id {queue_id!r} of {broker!r} is not a number")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
                raise OptionError(
                    f"{name}: offset {offset!r} of {broker}/{queue_id} must be an integer >= 0, "
                    "or -2 (earliest) / -1 (latest)"
                )
            parsed.append((int(queue_id), offset))
        per_queue.append((broker, tuple(sorted(parsed))))
    return OffsetSpec(kind="json", per_queue=tuple(per_queue))


@dataclass(frozen=True)
class Connection:
    """What a task needs to reach the proxy."""

    endpoint: str
    timeout_ms: int = 10_000
    # AK/SK and TLS for a secured proxy (options accessKey, secretKey, tls, tlsCaFile, and
    # tlsCertFile/tlsKeyFile: a client certificate for a proxy that requires one).
    security: ClientSecurity | None = None


@dataclass(frozen=True)
class ReadOptions:
    connection: Connection
    topic: str
    mode: Literal["offset", "pop"]
    starting: OffsetSpec
    ending: OffsetSpec  # batch reads only
    fail_on_data_loss: bool
    max_messages_per_trigger: int | None
    max_messages_per_partition: int
    pull_batch_size: int
    pull_concurrency: int
    filter_expression: str
    group: str  # pop mode: the consumer group; offset mode: commit progress there (optional)
    invisible_time_ms: int
    pop_partitions: int | None
    pop_long_polling_ms: int
    max_messages: int  # batch reads in pop mode: how many to pop
    # Kafka-style `subscribe` (several topics) or `subscribePattern`; `topic` is the one topic
    # when there is exactly one (else empty, and the multi-topic readers take over).
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    # Kafka's minOffsetsPerTrigger / maxTriggerDelay (streams in offset mode)
    min_messages_per_trigger: int | None = None
    max_trigger_delay_ms: int | None = None

    @property
    def multi_topic(self) -> bool:
        return self.topic_pattern is not None or len(self.topics) > 1


@dataclass(frozen=True)
class WriteOptions:
    connection: Connection
    topic: str  # may be empty when the DataFrame has a topic column
    send_batch_size: int
    max_inflight: int
    # exactlyOnce: where the sink records each committed batch (a local or mounted directory)
    commit_log: str | None = None

    @property
    def exactly_once(self) -> bool:
        return self.commit_log is not None


_COMMON = {
    "endpoint", "topic", "requesttimeoutms", "accesskey", "secretkey", "tls", "tlscafile",
    "tlscertfile", "tlskeyfile",
}  # fmt: skip
READ_OPTIONS = _COMMON | {
    "mode",
    "startingoffsets",
    "endingoffsets",
    "failondataloss",
    "maxmessagespertrigger",
    "maxmessagesperpartition",
    "pullbatchsize",
    "pullconcurrency",
    "filter",
    "group",
    "invisibletimems",
    "poppartitions",
    "poplongpollingms",
    "maxmessages",
    # Spark's Kafka source names, for users who type them
    "subscribe",
    "subscribepattern",
    "maxoffsetspertrigger",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "minoffsetspertrigger",
    "maxtriggerdelay",
}
WRITE_OPTIONS = _COMMON | {"sendbatchsize", "maxinflight", "exactlyonce", "commitlogdir"}
# Spark adds these on its own for some calls.
_SPARK_OWNED = {"path", "checkpointlocation", "__partition_columns"}


class _Options:
    """Typed access to Spark's string options, with errors naming the option."""

    def __init__(self, raw: Mapping[str, str], known: set[str], role: str) -> None:
        self.raw = {str(k).lower(): str(v) for k, v in raw.items() if v is not None}
        unknown = sorted(k for k in self.raw if k not in known and k not in _SPARK_OWNED)
        if unknown:
            raise OptionError(
                f"unknown option(s) {', '.join(unknown)} for {role}; known options are "
                f"{', '.join(sorted(_display(k) for k in known))}"
            )

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.raw.get(name.lower())
        if value is None or value.strip() == "":
            return default
        return value.strip()

    def required(self, name: str, hint: str) -> str:
        value = self.text(name)
        if value is None:
            raise OptionError(f"option '{name}' is required: {hint}")
        return value

    def integer(self, name: str, default: int | None, minimum: int = 1) -> int | None:
        value = self.text(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise OptionError(f"option '{name}'={value!r} must be an integer") from None
        if number < minimum:
            raise OptionError(f"option '{name}'={number} must be >= {minimum}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise OptionError(f"option '{name}'={value!r} must be true or false")


def _display(lower: str) -> str:
    names = {
        "requesttimeoutms": "requestTimeoutMs",
        "accesskey": "accessKey",
        "secretkey": "secretKey",
        "tlscafile": "tlsCaFile",
        "tlscertfile": "tlsCertFile",
        "tlskeyfile": "tlsKeyFile",
        "startingoffsets": "startingOffsets",
        "endingoffsets": "endingOffsets",
        "failondataloss": "failOnDataLoss",
        "maxmessagespertrigger": "maxMessagesPerTrigger",
        "maxmessagesperpartition": "maxMessagesPerPartition",
        "pullbatchsize": "pullBatchSize",
        "pullconcurrency": "pullConcurrency",
        "invisibletimems": "invisibleTimeMs",
        "poppartitions": "popPartitions",
        "poplongpollingms": "popLongPollingMs",
        "maxmessages": "maxMessages",
        "sendbatchsize": "sendBatchSize",
        "maxinflight": "maxInflight",
        "exactlyonce": "exactlyOnce",
        "commitlogdir": "commitLogDir",
        "subscribepattern": "subscribePattern",
        "maxoffsetspertrigger": "maxOffsetsPerTrigger",
        "startingtimestamp": "startingTimestamp",
        "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
        "minoffsetspertrigger": "minOffsetsPerTrigger",
        "maxtriggerdelay": "maxTriggerDelay",
    }
    return names.get(lower, lower)


def _connection(options: _Options) -> Connection:
    endpoint = options.required("endpoint", "the proxy address as HOST:PORT, e.g. 127.0.0.1:8081")
    try:
        host, port = parse_endpoint(endpoint)
    except ValueError as error:
        raise OptionError(f"option 'endpoint': {error}") from None
    timeout = options.integer("requestTimeoutMs", 10_000, minimum=100)
    access_key, secret_key = options.text("accessKey", ""), options.text("secretKey", "")
    ca_file = options.text("tlsCaFile")
    cert_file, key_file = options.text("tlsCertFile"), options.text("tlsKeyFile")
    if bool(cert_file) != bool(key_file):
        raise OptionError("options 'tlsCertFile'/'tlsKeyFile': give both a client certificate "
                          "and its key, or neither")  # fmt: skip
    tls = options.boolean("tls", False) or bool(ca_file) or bool(cert_file)
    security = None
    if access_key or secret_key or tls:
        try:  # Spark redacts option values named like *secret* in its UI and plans
            security = ClientSecurity(
                access_key or "", secret_key or "", tls, Path(ca_file) if ca_file else None,
                Path(cert_file) if cert_file else None, Path(key_file) if key_file else None,
            )  # fmt: skip
        except ValueError as error:
            raise OptionError(f"options 'accessKey'/'secretKey': {error}") from None
    return Connection(endpoint=f"{host}:{port}", timeout_ms=timeout or 10_000, security=security)


def parse_read_options(raw: Mapping[str, str], streaming: bool) -> ReadOptions:
    role = "spark.readStream.format('popmq')" if streaming else "spark.read.format('popmq')"
    options = _Options(raw, READ_OPTIONS, role)
    connection = _connection(options)
    topics, pattern = _read_topics(options)
    topic = topics[0] if len(topics) == 1 and pattern is None else ""
    mode = (options.text("mode", "offset") or "offset").lower()
    if mode not in ("offset", "pop"):
        raise OptionError(f"option 'mode'={mode!r} must be 'offset' (the default) or 'pop'")
    group = options.text("group", "") or ""
    if mode == "pop" and not group:
        raise OptionError("mode=pop needs option 'group': the consumer group that pops and acks")
    if mode == "pop" and not topic:
        raise OptionError("mode=pop reads one topic: give 'topic' (or 'subscribe' with one)")

    starting = _starting_spec(options, streaming)
    ending_text = options.text("endingOffsets")
    if ending_text is not None and streaming:
        raise OptionError("endingOffsets is for batch reads; a stream has no end")
    ending = parse_offset_spec("endingOffsets", ending_text or "latest")
    if ending.kind == "earliest":
        raise OptionError("endingOffsets='earliest' would read nothing; use 'latest' or offsets")
    if mode == "pop" and (_starting_given(options) or ending_text):
        raise OptionError("mode=pop reads where the group stands; drop startingOffsets/ending")
    if not topic and (starting.kind in ("json", "timestamps") or ending.kind == "json"):
        raise OptionError(
            "per-queue JSON offsets name one topic's queues; with several topics use "
            "'earliest', 'latest' or a timestamp"
        )

    max_per_trigger = _max_per_trigger(options)
    min_per_trigger = options.integer("minOffsetsPerTrigger", None)
    if min_per_trigger is not None and (mode == "pop" or not streaming):
        raise OptionError("minOffsetsPerTrigger is for streams in offset mode")
    if min_per_trigger is not None and max_per_trigger is not None:
        if min_per_trigger > max_per_trigger:
            raise OptionError(
                f"minOffsetsPerTrigger={min_per_trigger} is above maxOffsetsPerTrigger="
                f"{max_per_trigger}"
            )
    delay_text = options.text("maxTriggerDelay")
    max_delay = parse_delay_ms(delay_text) if delay_text is not None else None
    if mode == "pop" and max_per_trigger is None:
        max_per_trigger = 10_000  # a pop batch needs a bound: it is not planned from offsets
    return ReadOptions(
        connection=connection,
        topic=topic,
        mode=mode,  # type: ignore[arg-type]
        starting=starting,
        ending=ending,
        fail_on_data_loss=options.boolean("failOnDataLoss", True),
        max_messages_per_trigger=max_per_trigger,
        max_messages_per_partition=options.integer("maxMessagesPerPartition", 200_000) or 1,
        pull_batch_size=options.integer("pullBatchSize", 32) or 1,  # the proxy max batch
        pull_concurrency=options.integer("pullConcurrency", 8) or 1,
        filter_expression=options.text("filter", "*") or "*",
        group=group,
        invisible_time_ms=options.integer("invisibleTimeMs", 300_000) or 1,
        pop_partitions=options.integer("popPartitions", None),
        # RocketMQ proxies reject long polls below their minimum (5 s by default).
        pop_long_polling_ms=options.integer("popLongPollingMs", 5_000, minimum=0) or 0,
        max_messages=options.integer("maxMessages", 10_000) or 1,
        topics=topics,
        topic_pattern=pattern,
        min_messages_per_trigger=min_per_trigger,
        max_trigger_delay_ms=max_delay,
    )


def _read_topics(options: _Options) -> tuple[tuple[str, ...], str | None]:
    """Exactly one of topic, subscribe (a comma list) or subscribePattern (a regex that must
    match a whole topic name, like Kafka's)."""
    given = [name for name in ("topic", "subscribe", "subscribePattern") if options.text(name)]
    if not given:
        raise OptionError(
            "option 'topic' is required: the topic to read (or 'subscribe' with a comma-"
            "separated list of topics, or 'subscribePattern' with a regular expression)"
        )
    if len(given) != 1:
        raise OptionError(
            "give exactly one of 'topic' (one topic), 'subscribe' (a comma-separated list) or "
            f"'subscribePattern' (a regular expression), not {' and '.join(given)}"
        )
    if given[0] == "topic":
        return (options.required("topic", ""),), None
    if given[0] == "subscribe":
        names = [n.strip() for n in (options.text("subscribe") or "").split(",")]
        if not all(names):
            raise OptionError("option 'subscribe' has an empty topic name; use 'a,b,c'")
        return tuple(sorted(set(names))), None
    pattern = options.text("subscribePattern") or ""
    try:
        re.compile(pattern)
    except re.error as error:
        raise OptionError(f"option 'subscribePattern'={pattern!r}: {error}") from None
    return (), pattern


_STARTING_NAMES = ("startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp")


def _starting_given(options: _Options) -> bool:
    return any(options.text(name) for name in _STARTING_NAMES)


def _starting_spec(options: _Options, streaming: bool) -> OffsetSpec:
    """Kafka's precedence: startingTimestamp, then startingOffsetsByTimestamp, then
    startingOffsets."""
    stamp = options.text("startingTimestamp")
    if stamp is not None:
        if not stamp.isdigit():
            raise OptionError(
                f"option 'startingTimestamp'={stamp!r} must be epoch milliseconds (digits)"
            )
        return OffsetSpec(kind="timestamp", timestamp_ms=int(stamp))
    by_time = options.text("startingOffsetsByTimestamp")
    if by_time is not None:
        if not by_time.startswith("{"):
            raise OptionError(
                "option 'startingOffsetsByTimestamp' must be per-queue JSON of epoch "
                'milliseconds, like {"broker-a": {"0": 1700000000000}} (-2 = earliest, '
                "-1 = latest)"
            )
        spec = _parse_offsets_json("startingOffsetsByTimestamp", by_time)
        return OffsetSpec(kind="timestamps", per_queue=spec.per_queue)
    default = "latest" if streaming else "earliest"
    return parse_offset_spec("startingOffsets", options.text("startingOffsets", default))  # type: ignore[arg-type]


_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_ms(text: str) -> int:
    """Spark's time strings: '15m', '30s', '500ms', '1h'; a bare number is milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in ("", *_UNITS_MS):
        raise OptionError(
            f"option 'maxTriggerDelay'={text!r} must be a duration like '15m', '30s' or '500ms'"
        )
    return int(match.group(1)) * _UNITS_MS.get(match.group(2) or "ms", 1)


def _max_per_trigger(options: _Options) -> int | None:
    """maxMessagesPerTrigger, or its Kafka name maxOffsetsPerTrigger (the same meaning here:
    offsets of a queue are consecutive messages)."""
    ours = options.integer("maxMessagesPerTrigger", None)
    kafka = options.integer("maxOffsetsPerTrigger", None)
    if ours is not None and kafka is not None and ours != kafka:
        raise OptionError(
            f"maxMessagesPerTrigger={ours} and its alias maxOffsetsPerTrigger={kafka} disagree; "
            "give one"
        )
    return ours if ours is not None else kafka


def parse_write_options(
    raw: Mapping[str, str], has_topic_column: bool, streaming: bool = False
) -> WriteOptions:
    options = _Options(raw, WRITE_OPTIONS, "df.write.format('popmq')")
    connection = _connection(options)
    topic = options.text("topic", "") or ""
    if not topic and not has_topic_column:
        raise OptionError("option 'topic' is required (or give the DataFrame a 'topic' column)")
    commit_log = None
    if options.boolean("exactlyOnce", False):
        if has_topic_column or not topic:
            raise OptionError(
                "exactlyOnce writes one topic: give option 'topic' and no 'topic' column"
            )
        commit_log = _commit_log_dir(options, streaming)
    return WriteOptions(
        connection=connection,
        topic=topic,
        send_batch_size=options.integer("sendBatchSize", 64) or 1,
        max_inflight=options.integer("maxInflight", 8) or 1,
        commit_log=commit_log,
    )


# Under the query's checkpoint: the sink's record of committed batches (exactly_once.py).
COMMIT_LOG_SUBDIR = "popmq-exactly-once"


def _commit_log_dir(options: _Options, streaming: bool) -> str:
    """commitLogDir, or for a stream <checkpointLocation>/popmq-exactly-once. Python's own
    file calls write it, so it must be a local or mounted path (file: URIs are accepted)."""
    given = options.text("commitLogDir")
    if given is None and streaming:
        checkpoint = options.text("checkpointLocation")
        if checkpoint is not None:
            given = str(Path(_local_path(checkpoint, "checkpointLocation")) / COMMIT_LOG_SUBDIR)
    if given is None:
        raise OptionError(
            "exactlyOnce needs a directory for its commit log: a stream's option "
            "'checkpointLocation', or option 'commitLogDir' (required for batch writes)"
        )
    return str(Path(_local_path(given, "commitLogDir")).absolute())


def _local_path(value: str, name: str) -> str:
    if value.startswith("file://"):
        return value.removeprefix("file://")
    if value.startswith("file:"):
        return value.removeprefix("file:")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value):
        raise OptionError(
            f"option '{name}'={value!r}: exactlyOnce keeps its commit log with Python's file "
            "calls, so it needs a local or mounted path; give option 'commitLogDir'"
        )
    return value
