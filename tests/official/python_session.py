"""A long-lived official-client process driven by JSON lines (runs in .venv-client).

Each client runs in its own interpreter, as a separate application would (popmq and the official
client can share one process too: tests/official/test_coexistence.py). Usage:

    .venv-client/bin/python tests/official/python_session.py '{"endpoint": "127.0.0.1:8081",
        "role": "producer" | "simple" | "push", "topics": [...], "group": "...", ...}'

then one JSON command per stdin line; one JSON answer per command on stdout:
``{"ok": true, ...}`` or ``{"ok": false, "error": "<ExceptionType>", "code": <int|null>,
"message": "..."}``. The first line printed is ``{"ok": true, "ready": true, ...}`` once the
client has started (or ``ok: false`` if startup failed). See ``Session.handle`` for the ops.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

# The protocol uses the real stdout; everything else the library might print goes to stderr.
_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
sys.stdout = sys.stderr

from rocketmq import (  # noqa: E402
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import FilterType, definition_pb2  # noqa: E402


def emit(payload: dict[str, Any]) -> None:
    _OUT.write(json.dumps(payload) + "\n")
    _OUT.flush()


def error_payload(exc: BaseException) -> dict[str, Any]:
    code = getattr(exc, "code", None)
    if callable(code):  # grpc errors: code() is a StatusCode
        try:
            code = str(code())
        except Exception:
            code = None
    return {
        "ok": False,
        "error": type(exc).__name__,
        "code": code if isinstance(code, int | str) or code is None else str(code),
        "message": str(exc),
    }


def message_to_json(msg: Message) -> dict[str, Any]:
    body = msg.body or b""
    return {
        "message_id": msg.message_id,
        "topic": msg.topic,
        "body": body.decode("utf-8", errors="replace"),
        "body_len": len(body),
        "tag": msg.tag,
        "keys": sorted(msg.keys or []),
        "message_group": msg.message_group,
        "properties": dict(msg.properties or {}),
        "delivery_attempt": msg.delivery_attempt,
        "receipt_handle": msg.receipt_handle,
        "born_timestamp": msg.born_timestamp,
        "born_host": msg.born_host,
        "message_type": msg.message_type,
        "transport_delivery_timestamp": msg.transport_delivery_timestamp,
        "delivery_timestamp": msg.delivery_timestamp,
        "corrupted": msg.corrupted,
        "received_at_ms": int(time.time() * 1000),
    }


def build_message(topic: str, spec: dict[str, Any]) -> Message:
    msg = Message()
    msg.topic = spec.get("topic", topic)
    if "body_b64" in spec:
        msg.body = base64.b64decode(spec["body_b64"])
    elif "size" in spec:
        msg.body = (spec.get("body", "x") * spec["size"]).encode()[: spec["size"]]
    else:
        msg.body = spec["body"].encode()
    if spec.get("tag"):
        msg.tag = spec["tag"]
    for key in spec.get("keys", []):
        msg.keys = key
    if spec.get("group"):
        msg.message_group = spec["group"]
    if spec.get("delay_s"):
        msg.delivery_timestamp = int(time.time()) + int(spec["delay_s"])
    if spec.get("delay_ms"):  # as the client's docstring says: milliseconds since the epoch
        msg.delivery_timestamp = int(time.time() * 1000) + int(spec["delay_ms"])
    for key, value in spec.get("properties", {}).items():
        msg.add_property(key, value)
    return msg


class Listener(MessageListener):
    """PushConsumer listener: records every delivery; fails the first N attempts if asked;
    takes sleep_s per message if asked (a slow handler)."""

    def __init__(self, fail_attempts: int, sleep_s: float = 0.0) -> None:
        self.fail_attempts = fail_attempts
        self.sleep_s = sleep_s
        self.lock = threading.Lock()
        self.consumed: list[dict[str, Any]] = []
        self.started: list[str] = []  # message ids whose handling began

    def consume(self, message: Message) -> ConsumeResult:
        record = message_to_json(message)
        record["started"] = time.time()
        with self.lock:
            self.started.append(message.message_id)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        fail = (message.delivery_attempt or 1) <= self.fail_attempts
        record["result"] = "FAILURE" if fail else "SUCCESS"
        with self.lock:
            self.consumed.append(record)
        return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS


class Checker(TransactionChecker):
    """Answers check-backs by message body ("COMMIT", "ROLLBACK", else unknown) and records
    each check it was asked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decisions: dict[str, str] = {}
        self.checked: list[dict[str, Any]] = []

    def check(self, message: Message) -> Any:
        body = message.body.decode(errors="replace")
        with self.lock:
            decision = self.decisions.get(body, "UNKNOWN")
            self.checked.append({"body": body, "message_id": message.message_id,
                                 "topic": message.topic, "decision": decision})  # fmt: skip
        if decision == "COMMIT":
            return TransactionResolution.COMMIT
        if decision == "ROLLBACK":
            return TransactionResolution.ROLLBACK
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


class Session:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.role = config["role"]
        self.topics: list[str] = list(config.get("topics", []))
        self.received: dict[str, Message] = {}  # message_id -> latest copy (for ack etc.)
        client_config = ClientConfiguration(
            config["endpoint"],
            Credentials(config.get("ak", ""), config.get("sk", "")),
            config.get("namespace", ""),
            config.get("request_timeout", 3),
        )
        self.client_config = client_config
        # "filter_type": "SQL" subscribes with a SQL92 expression instead of a tag one.
        kind = FilterType.SQL if config.get("filter_type") == "SQL" else FilterType.TAG
        subscription = {
            topic: FilterExpression(config.get("filter", "*"), kind) for topic in self.topics
        }
        self.listener: Listener | None = None
        tls = bool(config.get("tls", False))  # roots: GRPC_DEFAULT_SSL_ROOTS_FILE_PATH
        self.checker: Checker | None = None
        if self.role == "producer" and config.get("transactional"):
            self.checker = Checker()
            self.client: Any = Producer(
                client_config, self.topics or None, checker=self.checker, tls_enable=tls
            )
        elif self.role == "producer":
            self.client = Producer(client_config, self.topics or None, tls_enable=tls)
        elif self.role == "simple":
            self.client = SimpleConsumer(
                client_config, config["group"], subscription, config.get("await_s", 20),
                tls_enable=tls,
            )  # fmt: skip
        elif self.role == "push":
            self.listener = Listener(
                int(config.get("fail_attempts", 0)), float(config.get("sleep_s", 0))
            )
            self.client = PushConsumer(
                client_config, config["group"], self.listener, subscription,
                consumption_thread_count=config.get("threads", 4), tls_enable=tls,
            )  # fmt: skip
        else:
            raise ValueError(f"unknown role {self.role!r}")

    def start(self) -> None:
        self.client.startup()

    # -- ops ---------------------------------------------------------------------------------
    def op_send(self, cmd: dict[str, Any]) -> dict[str, Any]:
        results = []
        default_topic = cmd.get("topic") or (self.topics[0] if self.topics else "")
        for spec in cmd["messages"]:
            started = time.monotonic()
            try:
                receipt = self.client.send(build_message(default_topic, spec))
                queue = receipt.message_queue
                results.append({
                    "ok": True,
                    "message_id": receipt.message_id,
                    "offset": receipt.offset,
                    "recall_handle": receipt.recall_handle,
                    "queue": str(queue) if queue is not None else None,
                    "elapsed_s": time.monotonic() - started,
                })  # fmt: skip
            except Exception as exc:
                results.append(error_payload(exc))
        return {"ok": True, "results": results}

    def op_tx_send(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """One transactional message, then cmd["end"]: "commit", "rollback" or "none" (the
        transaction is left open, for a check-back)."""
        topic = cmd.get("topic") or self.topics[0]
        transaction = self.client.begin_transaction()
        receipt = self.client.send(build_message(topic, cmd["message"]), transaction)
        end = cmd.get("end", "commit")
        if end == "commit":
            transaction.commit()
        elif end == "rollback":
            transaction.rollback()
        return {"ok": True, "message_id": receipt.message_id,
                "transaction_id": receipt.transaction_id}  # fmt: skip

    def op_set_decisions(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.checker is not None, "not a transactional producer"
        with self.checker.lock:
            self.checker.decisions.update(cmd["decisions"])
        return {"ok": True}

    def op_checked(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """The check-backs seen so far; waits up to timeout_s for at least ``count``."""
        assert self.checker is not None, "not a transactional producer"
        deadline = time.monotonic() + float(cmd.get("timeout_s", 0))
        while True:
            with self.checker.lock:
                checked = list(self.checker.checked)
            if len(checked) >= int(cmd.get("count", 0)) or time.monotonic() >= deadline:
                return {"ok": True, "checked": checked}
            time.sleep(0.05)

    def _remember(self, messages: list[Message]) -> list[dict[str, Any]]:
        for msg in messages:
            self.received[msg.message_id] = msg
        return [message_to_json(msg) for msg in messages]

    def op_receive(self, cmd: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        messages = self.client.receive(cmd.get("max", 16), cmd.get("invisible_s", 15))
        return {
            "ok": True,
            "messages": self._remember(messages),
            "elapsed_s": time.monotonic() - started,
        }

    def op_receive_until(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Receive until `count` messages arrived (acking them if asked) or `timeout_s`."""
        want, deadline = cmd["count"], time.monotonic() + cmd.get("timeout_s", 30)
        got: list[dict[str, Any]] = []
        calls = empties = 0
        errors: list[dict[str, Any]] = []
        while len(got) < want and time.monotonic() < deadline:
            calls += 1
            try:
                messages = self.client.receive(cmd.get("max", 16), cmd.get("invisible_s", 15))
            except Exception as exc:
                errors.append(error_payload(exc))
                time.sleep(0.2)
                continue
            if not messages:
                empties += 1
            for msg in messages:
                if cmd.get("ack", True):
                    try:
                        self.client.ack(msg)
                    except Exception as exc:
                        errors.append(error_payload(exc))
            got.extend(self._remember(messages))
        return {"ok": True, "messages": got, "calls": calls, "empties": empties, "errors": errors}

    def op_recall(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Producer.recall_message(topic, recall_handle): the recalled message's id."""
        message_id = self.client.recall_message(cmd["topic"], cmd["recall_handle"])
        return {"ok": True, "message_id": message_id}

    def op_ack(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.client.ack(self.received[cmd["id"]])
        return {"ok": True}

    def op_change_invisible(self, cmd: dict[str, Any]) -> dict[str, Any]:
        msg = self.received[cmd["id"]]
        old = msg.receipt_handle
        try:
            self.client.change_invisible_duration(msg, cmd["invisible_s"])
        except Exception as exc:
            failed = error_payload(exc)
            failed["receipt_handle"] = msg.receipt_handle
            return failed
        return {"ok": True, "receipt_handle": msg.receipt_handle, "old_receipt_handle": old}

    def op_set_handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Put back an older handle (to check that a replaced handle no longer works)."""
        self.received[cmd["id"]].receipt_handle = cmd["receipt_handle"]
        return {"ok": True}

    def op_adopt(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Take over a message received by another session (maybe through another proxy):
        rebuild it from its topic, id and receipt handle, bound to THIS session's endpoint."""
        pb = definition_pb2.Message()
        pb.topic.name = cmd["topic"]
        pb.body = cmd.get("body", "x").encode()
        pb.system_properties.message_id = cmd["message_id"]
        pb.system_properties.receipt_handle = cmd["receipt_handle"]
        pb.system_properties.body_encoding = definition_pb2.IDENTITY
        pb.system_properties.body_digest.type = definition_pb2.CRC32
        msg = Message().fromProtobuf(pb)
        msg.endpoints = self.client_config.rpc_endpoints
        self.received[msg.message_id] = msg
        return {"ok": True}

    def op_push_collect(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.listener is not None, "push_collect needs role push"
        want, deadline = cmd["count"], time.monotonic() + cmd.get("timeout_s", 30)
        while time.monotonic() < deadline:
            with self.listener.lock:
                done = sum(1 for r in self.listener.consumed if r["result"] == "SUCCESS")
            if done >= want:
                break
            time.sleep(0.05)
        with self.listener.lock:
            consumed = list(self.listener.consumed)
        return {"ok": True, "consumed": consumed}

    def op_push_started(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Wait until `count` deliveries began (handlers may still be running)."""
        assert self.listener is not None, "push_started needs role push"
        deadline = time.monotonic() + cmd.get("timeout_s", 30)
        while time.monotonic() < deadline:
            with self.listener.lock:
                started = list(self.listener.started)
            if len(started) >= cmd["count"]:
                break
            time.sleep(0.05)
        return {"ok": True, "started": started}

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = getattr(self, f"op_{cmd['op']}", None)
        if op is None:
            return {"ok": False, "error": "UnknownOp", "code": None, "message": cmd["op"]}
        try:
            return op(cmd)
        except Exception as exc:
            payload = error_payload(exc)
            payload["traceback"] = traceback.format_exc(limit=3)
            return payload

    def shutdown(self) -> None:
        try:
            self.client.shutdown()
        except Exception:
            traceback.print_exc()


def main() -> int:
    config = json.loads(sys.argv[1])
    try:
        session = Session(config)
        session.start()
    except Exception as exc:
        emit(error_payload(exc))
        return 1
    emit({"ok": True, "ready": True, "client_id": session.client.client_id})
    try:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            cmd = json.loads(line)
            if cmd.get("op") == "shutdown":
                break
            emit(session.handle(cmd))
    finally:
        session.shutdown()
        emit({"ok": True, "closed": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
