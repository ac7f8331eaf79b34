"""A producer's Telemetry stream that answers transaction check-backs, for the blocking Client.

The proxy asks a live producer of a topic about each half message left without a decision
(RecoverOrphanedTransactionCommand on the producer's Telemetry stream). CheckerSession declares
the topics, reads that stream on a thread, asks the checker, and answers with EndTransaction
(SOURCE_SERVER_CHECK); a checker's None ("don't know yet") answers nothing, so the broker asks
again at its next check interval.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import grpc

from popmq.client import codec
from popmq.client.model import ReceivedMessage
from popmq.client.sync import Client
from popmq.pb.rocketmq.v2 import definition_pb2 as d
from popmq.pb.rocketmq.v2 import service_pb2 as s

log = logging.getLogger(__name__)

# True: commit, False: roll back, None: unknown yet.
TransactionChecker = Callable[[ReceivedMessage], bool | None]


class CheckerSession:
    """``with CheckerSession(client, topics, checker):`` answers check-backs meanwhile."""

    def __init__(self, client: Client, topics: Iterable[str], checker: TransactionChecker) -> None:
        self.client = client
        self.topics = sorted(set(topics))
        self.checker = checker
        self.answered = 0  # check-backs answered with a decision
        self._outgoing: queue.Queue[s.TelemetryCommand | None] = queue.Queue()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="popmq-tx-checker", daemon=True)

    def __enter__(self) -> CheckerSession:
        self._outgoing.put(self._settings())
        self._call = self.client._stub.Telemetry(self._requests(), metadata=self.client._meta())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._outgoing.put(None)
        if self._call is not None:
            self._call.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=self.client.timeout_s)

    def _settings(self) -> s.TelemetryCommand:
        settings = d.Settings(client_type=d.PRODUCER)
        settings.access_point.CopyFrom(codec.endpoints_of(self.client.endpoint))
        settings.request_timeout.CopyFrom(codec.duration_ms(int(self.client.timeout_s * 1000)))
        for topic in self.topics:
            settings.publishing.topics.add(name=topic)
        settings.user_agent.language = d.PYTHON
        return s.TelemetryCommand(settings=settings)

    def _requests(self) -> Iterator[s.TelemetryCommand]:
        while (command := self._outgoing.get()) is not None:
            yield command

    def _run(self) -> None:
        assert self._call is not None
        try:
            for command in self._call:
                if command.WhichOneof("command") == "recover_orphaned_transaction_command":
                    self._answer(command.recover_orphaned_transaction_command)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                log.warning("transaction checker stream ended: %s", error.code().name)

    def _answer(self, command: s.RecoverOrphanedTransactionCommand) -> None:
        message = codec.message_from_pb(command.message)
        try:
            decision = self.checker(message)
            if decision is None:
                return
            self.client.end_transaction(
                message.topic, message.message_id, command.transaction_id, decision,
                from_check=True,
            )  # fmt: skip
            self.answered += 1
        except Exception as exc:  # the broker asks again at its next check interval
            log.warning("transaction check of message %s failed: %s", message.message_id, exc)
