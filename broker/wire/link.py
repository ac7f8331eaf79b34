"""BrokerLink: the proxy's end of one broker's Watch stream (popmq.broker.v1 ``Watch``).

Every visibility watch this proxy holds on the broker travels on ONE long-lived bidirectional
stream: arms and cancels go out, events come back, matched by the watch id (and the arm's seq).
While a group stays idle nothing is sent either way; the stream's HTTP/2 keepalive notices a
broker that vanished.

When the stream breaks (broker restart, network), every armed watch becomes UNKNOWN and fires,
so the long polls waiting on it pop the broker once; the link reconnects with back-off and
re-sends the arms still pending, and the broker's level check answers at once for whatever
became visible meanwhile. Nothing is lost in between: see docs/longpolling.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from popmq.broker.contract.watch import VisibilityWatch
from popmq.broker.wire import convert

from popmq.lifecycle import AsyncClosing, Job, TaskOwner
from popmq.pb.broker.v1 import broker_pb2 as pb

log = logging.getLogger(__name__)

RECONNECT_START_S = 0.05
RECONNECT_MAX_S = 1.0


class BrokerLink(AsyncClosing):
    """The watch backend of one RemoteBrokerPort."""

    def __init__(self, name: str, stub: Callable[[], Any]) -> None:
        self._name = name
        self._stub = stub  # the port's stub factory: the link shares the port's channel
        self._watches: dict[int, VisibilityWatch] = {}
        self._outbox: asyncio.Queue[pb.WatchRequest | None] | None = None  # None: link down
        self._task: Job[None] | None = None
        self._tasks = TaskOwner(f"link:{name}", grace_s=0)  # the stream's reader
        self._closed = False
        self.connects = 0  # streams opened so far (a reconnect counts)
        # Streams that were open and then ended (metrics): a reconnect attempt that never got
        # through is not another loss, so an outage counts once, and only flapping adds up.
        self.losses = 0
        self._down = False  # a loss was reported and no stream got through since
        self._call: Any = None

    @property
    def watches(self) -> int:
        return len(self._watches)

    @property
    def up(self) -> bool:
        return self._outbox is not None

    # -- WatchBackend ----------------------------------------------------------------------------
    def send_arm(self, watch: VisibilityWatch) -> bool:
        self._watches[watch.id] = watch
        if self._task is None and not self._closed:
            # The first stream is about to open: arms queue for it in order (if it fails to
            # open, every watch becomes UNKNOWN as after any loss).
            self._outbox = asyncio.Queue()
            self._ensure_running()
        if self._outbox is None:
            return False
        self._outbox.put_nowait(_arm(watch))
        return True

    def send_cancel(self, watch: VisibilityWatch) -> None:
        if self._watches.pop(watch.id, None) is not None and self._outbox is not None:
            self._outbox.put_nowait(pb.WatchRequest(cancel=pb.WatchCancel(id=watch.id)))

    # -- the stream --------------------------------------------------------------------------
    def _ensure_running(self) -> None:
        if self._task is None and not self._closed:
            self._task = self._tasks.spawn(self._run(), f"link:{self._name}")

    async def _run(self) -> None:
        backoff = RECONNECT_START_S
        while not self._closed:
            connected = False
            first = self._outbox  # the first stream's queued arms, if any
            outbox: asyncio.Queue[pb.WatchRequest | None] = first or asyncio.Queue()
            try:
                call = self._stub().Watch(_drain(outbox))
                self._call = call
                # Up from here: arms queue behind the re-sent ones, in order, on this stream.
                self._outbox = outbox
                self.connects += 1
                if first is None:
                    for watch in list(self._watches.values()):
                        if watch.pending:
                            outbox.put_nowait(_arm(watch))
                            watch.on_link_up()
                await call.wait_for_connection()  # a broker that is down fails here
                connected = True
                if self._down:  # one line per change of state, not one per attempt
                    log.info("link to broker %s is back", self._name)
                    self._down = False
                async for event in call:
                    backoff = RECONNECT_START_S
                    target = self._watches.get(event.id)
                    if target is not None:
                        if event.status.code != convert.ok_status().code:
                            log.debug("watch %s on %s: %s", target.key, self._name, event.status)
                        target.on_event(event.seq)
                if not self._closed:
                    self._report_down(connected, "ended by the broker")
            except grpc.aio.AioRpcError as exc:
                if not self._closed:
                    self._report_down(connected, f"lost: {exc.code().name}")
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed or (task is not None and task.cancelling()):
                    raise
                self._report_down(connected, "cut")  # break_stream()
            except Exception:  # never leave a watch ARMED on a link that is not there
                log.exception("link to broker %s failed", self._name)
                self._down = True
            finally:
                if not self._closed and connected:
                    self.losses += 1
                self._outbox = None
                self._call = None
                outbox.put_nowait(None)
                for watch in list(self._watches.values()):
                    watch.on_link_lost()
            if self._closed:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _report_down(self, connected: bool, how: str) -> None:
        if connected or not self._down:
            log.warning("link to broker %s %s", self._name, how)
        else:
            log.debug("link to broker %s still down: %s", self._name, how)
        self._down = True

    def break_stream(self) -> None:
        """Cut the current stream as a network failure would (tests and chaos drills)."""
        if self._call is not None:
            self._call.cancel()

    async def aclose(self) -> None:
        self._closed = True
        self._task = None
        await self._tasks.aclose()


def _arm(watch: VisibilityWatch) -> pb.WatchRequest:
    key = watch.key
    return pb.WatchRequest(
        arm=pb.WatchArm(
            id=watch.id, seq=watch.seq, group=key.group, topic=key.topic,
            filter=convert.filter_to_proto(key.filter), fifo=key.fifo,
        )
    )  # fmt: skip


async def _drain(outbox: asyncio.Queue[pb.WatchRequest | None]) -> AsyncIterator[pb.WatchRequest]:
    while True:
        request = await outbox.get()
        if request is None:
            return
        yield request
