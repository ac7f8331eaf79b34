"""The notification hub: a proxy's long polls share one held notification per broker and group.

Without it, every long poll in its notify phase holds its own notification on every broker:
N idle consumers of a group cost N x B held requests, and one arrival wakes all N (each then
pops; N-1 pops come back empty). The hub holds ONE notification per **channel** --
(broker, group, topic, filter, fifo) -- while at least one long poll subscribes to it, and
turns the broker's "has message" into a **signal** for one subscriber at a time:

- the signal goes to the oldest subscriber that does not hold one already and is not about to
  end (at least ``ENDING_S`` left, or ``ENDING_SHARE`` of a shorter wait; a subscriber that
  cannot use it, because its long poll already has messages, declines: the next one gets
  it); only when every one is about to end, to the one with the most time left. Not a poll
  about to end: messages it pops just as its client's
  poll ends are popped for nobody and must be handed back (a sparse message was popped and
  handed back again and again that way). Not always the most time left either: that is
  whoever re-polled last, so one consumer of a group got every sparse message while the
  others waited out their whole polls;
- the subscriber reports what its pop did: ``used(rest_num)`` (it took messages; if the pop
  left more behind, the signal goes on to as many further subscribers as that backlog needs,
  at most ``MAX_PARALLEL_SIGNALS`` at once), ``missed()`` (an empty pop: someone else took the
  message) or ``pass_on()`` (it did not pop: its long poll found messages elsewhere);
- a subscriber that leaves while holding a signal (deadline, client gone) passes it on;
- while no signal is out, the channel's notification is held on the broker; it is armed again
  whenever the last signal comes back, so a message that landed meanwhile is reported at once
  (the broker answers "yes" straight away while anything is visible). After empty pops it is
  re-armed after a short growing pause rather than in a tight loop;
- the last subscriber to leave cancels the held notification, and ``leave`` waits until the
  broker call is gone.

With a broker whose port offers visibility watches (``proxy.longpoll.watches``: the link's
broker-pushed events, or the in-process equivalent) the channel's "held notification" is the
shared watch: nothing is sent to the broker while it stays armed, and a pop that leaves the
broker empty re-arms it. Ports without watches fall back to held notify calls.

Each long poll's own logic (first pop, result queue, one consume task at a time, the
deadline) stays in ``proxy.longpoll.notify``; the hub only shares the notification calls.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from typing import Any

from popmq.broker.contract.port import ConsumePort
from popmq.broker.contract.types import PopRequest
from popmq.proxy.longpoll.calls import BACKOFF_MAX_S, BrokerCalls
from popmq.proxy.longpoll.watches import WatchRegistry

from popmq.lifecycle import AsyncClosing, Job, TaskOwner

# A long poll with less time left than this, or than ENDING_SHARE of the wait it subscribed
# for, is about to end: a signal goes to it only when every other subscriber is about to end
# too (what it pops could reach its client too late). The share keeps short polls (1 s, as
# `bench e2e` sets) from all counting as ending, which gave every message to the newest.
ENDING_S = 1.0
ENDING_SHARE = 0.2
# How many subscribers a pop's leftover backlog may signal at once; more pops on the same
# broker at the same moment mostly find its queues locked by each other.
MAX_PARALLEL_SIGNALS = 4
# A broker that says "message" while the pops it triggers come back empty (queues busy with
# other pullers, another proxy faster) is asked again after a growing pause.
_MISS_PAUSE_START_S = 0.002
_MISS_PAUSE_MAX_S = BACKOFF_MAX_S / 5

# (broker, group, topic, filter text, filter kind, fifo): strings hash in C (a channel lookup
# per broker as every long poll joins and leaves); the filter dataclass's hash is a Python call.
ChannelKey = tuple[ConsumePort, str, str, str, str, bool]


def _key_tail(pop: PopRequest) -> tuple[str, str, str, str, bool]:
    """A channel key without its broker: made once per join or part, not once per broker."""
    return (pop.group, pop.topic, pop.filter.expression, pop.filter.kind, pop.fifo)


def _channel_key(port: ConsumePort, pop: PopRequest) -> ChannelKey:
    return (port, *_key_tail(pop))


_ABSENT = object()  # dict.pop's default: not subscribed


# Called when a subscription receives a signal; False declines it (the next one gets it).
OnSignal = Callable[["Subscription"], bool]


class Subscriber:
    """What a channel knows of one long poll waiting on it. A long poll that waits on every
    broker is ONE subscriber in each of their channels (``NotificationHub.join``), not an
    object per broker: 10,000 idle long polls on 4 brokers held 40,000 (docs/benchmarks.md,
    "Idle polls, wave 10")."""

    __slots__ = ("deadline", "ending_at", "want")

    def __init__(self, deadline: float, want: int, now: float) -> None:
        self.deadline = deadline
        # From then on it is about to end (ENDING_S, or ENDING_SHARE of a shorter wait).
        self.ending_at = deadline - min(ENDING_S, ENDING_SHARE * max(deadline - now, 0.0))
        self.want = max(want, 1)  # messages one pop of this long poll takes at most

    def on_signal(self, channel: Channel) -> bool:
        """``channel``'s broker has a message for this subscriber; False declines it. Then
        it reports what its pop did: ``channel.used``, ``missed`` or ``pass_on``."""
        raise NotImplementedError


class Subscription(Subscriber):
    """One callback's interest in one channel (``NotificationHub.subscribe``)."""

    __slots__ = ("_on_signal", "channel")

    def __init__(
        self, channel: Channel, deadline: float, want: int, on_signal: OnSignal, now: float
    ):
        super().__init__(deadline, want, now)
        self.channel = channel
        self._on_signal = on_signal

    def on_signal(self, channel: Channel) -> bool:
        return self._on_signal(self)

    @property
    def port(self) -> ConsumePort:
        return self.channel.port

    @property
    def holds_signal(self) -> bool:
        return self in self.channel.holders

    def used(self, rest_num: int) -> None:
        """Its pop took messages and left ``rest_num`` visible behind."""
        self.channel.used(self, rest_num)

    def missed(self) -> None:
        """Its pop came back empty (or failed)."""
        self.channel.missed(self)

    def pass_on(self) -> None:
        """It will not pop: give the signal to the next subscriber."""
        self.channel.pass_on(self)


class Channel:
    """The subscribers of one (broker, group, topic, filter, fifo) and its held notification."""

    def __init__(self, hub: NotificationHub, key: ChannelKey, pop: PopRequest) -> None:
        self.hub = hub
        self.key = key
        self.port: ConsumePort = key[0]
        self.pop = pop  # group, topic, filter, fifo of every notification request
        self.subscribers: dict[Subscriber, None] = {}  # oldest first
        self.holders: set[Subscriber] = set()  # subscribers holding a signal now
        self.task: Job[None] | None = None  # the held notification, when armed
        self.latest = 0.0  # the latest deadline of any subscriber so far (loop clock)
        self.misses = 0  # empty pops since the last pop that found messages
        self.watch = hub.watches.acquire(self.port, pop)  # None: held notify calls instead

    # -- signals ---------------------------------------------------------------------------
    def hand_out(self, count: int, skip: Subscriber | None = None) -> None:
        """Give a signal to up to ``count`` subscribers (not ``skip``): the oldest first of
        those not about to end, then those about to end, the most time left first; arm the
        notification if no signal is out afterwards."""
        handed = 0
        if count > 0:
            now = asyncio.get_running_loop().time()
            ending: list[Subscriber] = []
            # The oldest first: a walk over the few that hold a signal or are about to end
            # (they leave within ENDING_S), not a sort of every waiting poll. on_signal only
            # queues work (it never subscribes or leaves), so walking the live dict is safe.
            for sub in self.subscribers:
                if handed >= count:
                    break
                if sub is skip or sub in self.holders:
                    continue
                if sub.ending_at < now:
                    ending.append(sub)
                elif self._give(sub):
                    handed += 1
            if handed < count and ending:
                ending.sort(key=_deadline, reverse=True)  # stable: ties keep the oldest first
                for sub in ending:
                    if handed >= count:
                        break
                    if self._give(sub):
                        handed += 1
            if handed == 0:
                self.misses += 1  # everyone declined: re-look after a pause, never spin
        if not self.holders:
            self.arm()

    def _give(self, sub: Subscriber) -> bool:
        self.holders.add(sub)
        if sub.on_signal(self):
            return True
        self.holders.discard(sub)
        return False

    def add(self, sub: Subscriber) -> None:
        self.subscribers[sub] = None
        self.latest = max(self.latest, sub.deadline)

    def remove(self, sub: Subscriber) -> bool:
        """Forget ``sub``; False if it was not subscribed."""
        return self.subscribers.pop(sub, False) is not False

    # What the pop of a subscriber holding this channel's signal did.
    def used(self, sub: Subscriber, rest_num: int) -> None:
        """It took messages and left ``rest_num`` visible behind."""
        self.resolve(sub, rest_num=rest_num, missed=False)

    def missed(self, sub: Subscriber) -> None:
        """It came back empty (or failed)."""
        self.resolve(sub, rest_num=0, missed=True)

    def pass_on(self, sub: Subscriber) -> None:
        """It will not pop: the signal goes to the next subscriber."""
        self.resolve(sub, rest_num=None, missed=False)

    def resolve(self, sub: Subscriber, *, rest_num: int | None, missed: bool) -> None:
        if sub not in self.holders:
            return  # it left, and its signal went on already
        self.holders.discard(sub)
        if rest_num is None:  # passed on unused
            self.hand_out(1, skip=sub)
        elif missed:
            self.misses += 1
            self._rearm_watch()
            if not self.holders:
                self.arm()
        else:
            self.misses = 0
            if rest_num > 0:
                wanted = min(MAX_PARALLEL_SIGNALS, math.ceil(rest_num / sub.want))
                self.hand_out(wanted - len(self.holders), skip=sub)
            else:
                self._rearm_watch()
                if not self.holders:
                    self.arm()

    def _rearm_watch(self) -> None:
        """A pop left the broker empty: the broker tells us when that changes."""
        if self.watch is not None:
            self.hub.watches.arm(self.watch)

    # -- the held notification ---------------------------------------------------------------
    def arm(self) -> None:
        if self.task is not None or self.holders or not self.subscribers:
            return
        pause = 0.0
        if self.misses > 2:
            pause = min(_MISS_PAUSE_START_S * 2 ** (self.misses - 3), _MISS_PAUSE_MAX_S)
        self.task = self.hub.start(self._notify(pause), f"notify:{self.port.name}")

    async def _notify(self, pause: float) -> None:
        try:
            if pause:
                await asyncio.sleep(pause)
            if self.watch is not None:
                # Armed watch: wait for the broker's event (or a lost link); costs no calls.
                held = self.hub.calls.metrics.notification_held
                held(1)
                try:
                    await self.watch.wait()
                finally:
                    held(-1)
                found = True
            else:
                # Held until the latest subscriber's deadline; the last one to leave cancels it.
                found = await self.hub.calls.watch(self.port, self.pop, lambda: self.latest)
        finally:
            if self.task is not None and self.task.is_current():
                self.task = None
        if found:
            self.hand_out(1)
        # Not found: every subscriber's deadline has passed; they are leaving. One that
        # subscribes meanwhile arms a new notification.


def _deadline(sub: Subscriber) -> float:
    return sub.deadline


class NotificationHub(AsyncClosing):
    """Shared notification channels of one proxy (owned by its notify strategy)."""

    def __init__(self, calls: BrokerCalls, watches: WatchRegistry | None = None) -> None:
        self.calls = calls
        self.watches = watches or WatchRegistry(
            on_arm=partial(calls.metrics.broker_call, "watch_arm")
        )
        self._channels: dict[ChannelKey, Channel] = {}
        # The held notifications; closing cancels them at once (grace 0: they only wait).
        self.tasks = TaskOwner("notification-hub", grace_s=0)

    def start(self, coro: Coroutine[Any, Any, None], name: str) -> Job[None] | None:
        return self.tasks.spawn(coro, name)

    @property
    def channels(self) -> int:
        """Channels with at least one subscriber."""
        return len(self._channels)

    def held(self) -> int:
        """Channels whose notification is held on (or about to be sent to) a broker."""
        return sum(1 for channel in self._channels.values() if channel.task is not None)

    def signalled(self, port: ConsumePort, pop: PopRequest) -> bool:
        """Whether a long poll holds this broker's signal for the group now (its pop is on
        the way)."""
        channel = self._channels.get(_channel_key(port, pop))
        return channel is not None and bool(channel.holders)

    def _channel(self, port: ConsumePort, pop: PopRequest) -> Channel:
        key = _channel_key(port, pop)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = Channel(self, key, pop)
        return channel

    def subscribe(
        self, port: ConsumePort, pop: PopRequest, deadline: float, on_signal: OnSignal
    ) -> Subscription:
        channel = self._channel(port, pop)
        now = asyncio.get_running_loop().time()
        sub = Subscription(channel, deadline, pop.max_messages, on_signal, now)
        channel.add(sub)
        channel.arm()  # no-op while armed or while a signal is out
        return sub

    def join(self, ports: Iterable[ConsumePort], pop: PopRequest, sub: Subscriber) -> None:
        """``sub`` waits on each port's channel for ``pop`` (one subscriber in all of them);
        ``part`` with the same ports and pop ends it."""
        # Once per idle receive on every broker: the key's tail is made once, and the
        # channel's add and arm are inlined (Channel.add, Channel.arm's first test).
        channels = self._channels
        tail = _key_tail(pop)
        deadline = sub.deadline
        for port in ports:
            key = (port, *tail)
            channel = channels.get(key)
            if channel is None:
                channel = channels[key] = Channel(self, key, pop)
            channel.subscribers[sub] = None
            if deadline > channel.latest:
                channel.latest = deadline
            if channel.task is None and not channel.holders:
                channel.arm()

    def part(
        self, ports: Iterable[ConsumePort], pop: PopRequest, sub: Subscriber
    ) -> list[Job[None]]:
        """``join`` undone at once (signals ``sub`` holds go on): the notifications this
        cancelled, to wait for."""
        ending: list[Job[None]] = []
        channels = self._channels
        tail = _key_tail(pop)
        for port in ports:
            channel = channels.get((port, *tail))
            if channel is None:
                continue
            subscribers = channel.subscribers
            if subscribers.pop(sub, _ABSENT) is _ABSENT:
                continue
            # The usual case, inline: others still wait and it held no signal. The channel
            # is the hub's (just found in it): nothing to hand on, cancel or release.
            if subscribers and sub not in channel.holders:
                continue
            task = self._left(channel, sub)
            if task is not None:
                ending.append(task)
        return ending

    def unsubscribe(self, sub: Subscription) -> Job[None] | None:
        """Remove a subscription now; a signal it held goes on to the next subscriber.
        Returns the channel's notification task when this cancelled it (last one out)."""
        return self._remove(sub.channel, sub)

    def _remove(self, channel: Channel, sub: Subscriber) -> Job[None] | None:
        if not channel.remove(sub):
            return None
        return self._left(channel, sub)

    def _left(self, channel: Channel, sub: Subscriber) -> Job[None] | None:
        """``sub`` was just removed from ``channel``'s subscribers."""
        held = sub in channel.holders
        channel.holders.discard(sub)
        if self._channels.get(channel.key) is not channel:
            # The hub closed first (its notifications are cancelled, its watches closed): a
            # long poll still on its way out only leaves; nothing is handed on or armed.
            return None
        if not channel.subscribers:
            if self._channels.get(channel.key) is channel:  # (aclose forgot them all)
                del self._channels[channel.key]
            if channel.watch is not None:
                self.watches.release(channel.port, channel.watch)
            task, channel.task = channel.task, None
            if task is not None:
                task.cancel()
            return task
        if held:
            channel.hand_out(1)
        return None

    async def leave(self, subs: Iterable[Subscription]) -> None:
        """Unsubscribe at once, then wait until the notifications this cancelled are gone
        (so the broker holds nothing for a long poll that has ended)."""
        for job in self.unsubscribe_all(subs):
            await job.wait()

    def unsubscribe_all(self, subs: Iterable[Subscription]) -> list[Job[None]]:
        """``leave`` without the wait: the notifications it cancelled, to wait for (most long
        polls share their notifications with others and cancel none)."""
        return [task for sub in subs if (task := self.unsubscribe(sub)) is not None]

    async def aclose(self) -> None:
        """Cancel every held notification (the proxy is stopping)."""
        self._channels.clear()
        self.watches.close()
        await self.tasks.aclose()
