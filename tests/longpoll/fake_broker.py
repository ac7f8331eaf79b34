"""A BrokerPort double whose messages appear on cue, for unit tests of the strategies.

Only what the strategies use is real (pop, notify, change_invisible_time, hand_back); pop and notify
hold like a broker's long polls, and ``held`` counts the requests being held right now, so a
test can assert that nothing is left waiting on the broker.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    ChangeInvisibleResult,
    NotifyRequest,
    NotifyResult,
    PoppedMessage,
    PopRequest,
    PopResult,
    PopStatus,
    StoredMessage,
)

_ids = itertools.count()


def now_ms() -> int:
    return int(time.time() * 1000)


class FakeBroker:
    def __init__(
        self, name: str, *, min_invisible_ms: int = 0, knows_hand_back: bool = True
    ) -> None:
        self._name = name
        self.min_invisible_ms = min_invisible_ms
        self.knows_hand_back = knows_hand_back  # False: a broker from before HandBack
        self.visible: list[StoredMessage] = []
        self.inflight: dict[str, StoredMessage] = {}
        self.held = 0  # pop / notify requests waiting right now
        self.max_concurrent_pops = 0
        self.calls: list[str] = []  # "pop", "pop-held", "notify", "change_invisible", "hand_back"
        self.handed_back: list[str] = []  # receipt handles given back by hand_back
        self.changes: list[int] = []  # invisible times asked for by change_invisible_time
        # Cues a test can set:
        self.steal_next_pops = 0  # pops that find the message gone (someone else got it)
        self.polling_full = 0  # held requests answered POLLING_FULL
        self.fail_notify: RefusedError | None = None
        self.fail_pop: Exception | None = None  # raised by every pop (a refusal, an outage)
        self.on_pop_answer: Callable[[PopResult], None] | None = None
        self._arrived = asyncio.Event()
        self._pops = 0

    @property
    def name(self) -> str:
        return self._name

    # -- cues --------------------------------------------------------------------------------
    def put(self, count: int = 1, topic: str = "t") -> list[StoredMessage]:
        stored = [self._message(topic) for _ in range(count)]
        self.visible.extend(stored)
        self._wake()
        return stored

    def _message(self, topic: str) -> StoredMessage:
        n = next(_ids)
        return StoredMessage(
            topic=topic, queue_id=0, queue_offset=n, body=b"m%d" % n, tag="", keys=[],
            properties={}, message_id=f"{self._name}-{n}", message_group="",
            delivery_timestamp_ms=0, born_timestamp_ms=now_ms(), born_host="test",
            store_timestamp_ms=now_ms(), store_host=self._name, reconsume_times=0,
        )  # fmt: skip

    def _wake(self) -> None:
        self._arrived.set()
        self._arrived = asyncio.Event()

    async def _hold(self, poll_time_ms: int) -> bool:
        """Wait for an arrival; False at the timeout."""
        self.held += 1
        try:
            async with asyncio.timeout(poll_time_ms / 1000):
                await self._arrived.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self.held -= 1

    # -- port --------------------------------------------------------------------------------
    async def pop(self, request: PopRequest) -> PopResult:
        self._pops += 1
        self.max_concurrent_pops = max(self.max_concurrent_pops, self._pops)
        try:
            result = await self._pop(request)
        finally:
            self._pops -= 1
        if self.on_pop_answer is not None:
            self.on_pop_answer(result)
        return result

    async def _pop(self, request: PopRequest) -> PopResult:
        self.calls.append("pop" if request.poll_time_ms == 0 else "pop-held")
        await asyncio.sleep(0)  # a real call always yields at least once
        if self.fail_pop is not None:
            raise self.fail_pop
        deadline = asyncio.get_running_loop().time() + request.poll_time_ms / 1000
        while True:
            if self.steal_next_pops and self.visible:
                self.steal_next_pops -= 1
                self.visible.clear()
            if self.visible:
                return self._take(request)
            left_ms = int((deadline - asyncio.get_running_loop().time()) * 1000)
            if left_ms <= 0:
                return PopResult(PopStatus.NO_MESSAGE)
            if self.polling_full:
                self.polling_full -= 1
                return PopResult(PopStatus.POLLING_FULL)
            if not await self._hold(left_ms):
                return PopResult(PopStatus.NO_MESSAGE)

    def _take(self, request: PopRequest) -> PopResult:
        taken = self.visible[: request.max_messages]
        del self.visible[: len(taken)]
        until = now_ms() + request.invisible_time_ms
        popped = []
        for message in taken:
            handle = f"{self._name}:{message.message_id}:{next(_ids)}"
            self.inflight[handle] = message
            popped.append(PoppedMessage(message, handle, until))
        return PopResult(PopStatus.FOUND, popped, rest_num=len(self.visible))

    async def notify(self, request: NotifyRequest) -> NotifyResult:
        self.calls.append("notify")
        await asyncio.sleep(0)
        if self.fail_notify is not None:
            raise self.fail_notify
        if self.visible:
            return NotifyResult(has_message=True)
        if request.poll_time_ms <= 0:
            return NotifyResult(has_message=False)
        if self.polling_full:
            self.polling_full -= 1
            return NotifyResult(has_message=False, polling_full=True)
        arrived = await self._hold(request.poll_time_ms)
        return NotifyResult(has_message=arrived and bool(self.visible))

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        self.calls.append("change_invisible")
        self.changes.append(invisible_time_ms)
        await asyncio.sleep(0)
        if invisible_time_ms < self.min_invisible_ms:
            raise RefusedError(Code.ILLEGAL_INVISIBLE_TIME, "below the minimum invisible time")
        message = self.inflight.pop(receipt_handle, None)
        if message is None:
            raise RefusedError(Code.INVALID_RECEIPT_HANDLE, "unknown handle")
        if invisible_time_ms == 0:
            self.visible.append(message)
            self._wake()
            return ChangeInvisibleResult(receipt_handle + "+", now_ms())
        new_handle = receipt_handle + "+"
        self.inflight[new_handle] = message
        return ChangeInvisibleResult(new_handle, now_ms() + invisible_time_ms)

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        self.calls.append("hand_back")
        await asyncio.sleep(0)
        if not self.knows_hand_back:
            raise RefusedError(Code.NOT_IMPLEMENTED, f"broker {self._name} does not know HandBack")
        count = 0
        for handle in receipt_handles:
            message = self.inflight.pop(handle, None)
            if message is not None:  # acked or changed meanwhile: skipped
                self.handed_back.append(handle)
                self.visible.append(message)
                count += 1
        if count:
            self._wake()
        return count
