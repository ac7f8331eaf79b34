"""A broker node's membership in its group: registration, election, fencing, the in-sync set.

``join_group(store, settings)`` is an async context manager that owns its task group. While
inside it the node

- holds a lease (``lease_ttl_s``, renewed every third of it, from a thread of its own: an event
  loop kept busy, by a promotion or a flood of calls, does not delay the keepalives) and its
  member key bound to it;
- campaigns whenever the group has no leader and it may lead: one transaction comparing the
  leader key's ``create_revision`` with 0 and the in-sync key's ``mod_revision`` with the one
  just read, putting the leader key (bound to its lease) and an in-sync set of itself. Only a
  node in the in-sync set may campaign, unless ``unclean_election`` (or the group is new),
  and only while ``may_campaign()`` says its own copy is whole: the recorded set can still
  name a node whose data was wiped, or is being reset, since it was recorded. An unclean
  election lets a node outside the set lead (losing what only the set held), but never a node
  whose copy holds no data at all (``holds_data()`` false: a wiped node) once the group has
  had a leader: it would start the group empty and reset every node that comes back with
  data. When only such nodes remain, the election is refused loudly (an ERROR naming the
  way out, ``popmq_ha_empty_copy_declines``) rather than wiping the group;
- publishes its view as a ``GroupRole`` (``role``, ``await role_changed()``).

Fencing: a leader may acknowledge writes only while ``may_write()``, which is false once its
lease deadline has passed. The deadline is measured on the monotonic clock (``time.monotonic``,
read when asked: never an event loop's cached time) from when the last successful keepalive was
*sent*, so it is never later than etcd's own expiry of the lease, and a paused or partitioned
leader stops acknowledging before anyone else can be elected.

A passed deadline is a fence, not a loss: the published role stays "leader" (``fenced`` is
set, ``may_write()`` is false) until the key is *known* lost (etcd says the lease is gone, or
the leader key is another's or absent). A late keepalive that finds the lease alive lifts the
fence, and the node serves again without closing and reopening its broker.

On a clean exit the lease is revoked: the leader key goes at once and another node takes over
without waiting for the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio

from popmq.coord.keys import DEFAULT_PREFIX, GroupKeys, decode, encode
from popmq.coord.store import (
    Compare,
    CoordStore,
    CoordUnavailableError,
    Delete,
    KeyValue,
    LeaseLostError,
    Put,
)

log = logging.getLogger("popmq.coord.group")


@dataclass(frozen=True, slots=True)
class GroupRole:
    """What a node knows of its group's leadership. ``epoch`` is the leader key's
    create_revision (0 while no leader is known)."""

    epoch: int
    leader_name: str
    leader_address: str
    is_leader: bool

    @property
    def has_leader(self) -> bool:
        return bool(self.leader_name)


NO_LEADER = GroupRole(0, "", "", False)


@dataclass(frozen=True, slots=True)
class MemberSettings:
    group: str
    name: str
    address: str  # host:port where proxies reach this node
    prefix: str = DEFAULT_PREFIX
    lease_ttl_s: int = 3
    unclean_election: bool = False
    # Re-read the group this often even if the watch is silent (a watch can stall unnoticed).
    poll_interval_s: float = 1.0
    retry_s: float = 0.5
    # A leader that could not take up its role (its promotion failed) gives the leader key
    # back and campaigns again only after this long (None: 2 TTLs): another in-sync node
    # leads meanwhile, or, if none can, this one tries again.
    give_up_hold_s: float | None = None
    # The keepalive thread stops renewing once the event loop has not run for this long
    # (None: 2 TTLs): a wedged loop must not hold the group's leadership for long. The lease
    # then runs up to one more TTL: a wedged leader holds its group at most 3 TTLs.
    loop_stall_limit_s: float | None = None


def leader_role(kv: KeyValue | None, own_lease: int, own_name: str) -> GroupRole:
    if kv is None:
        return NO_LEADER
    info = decode(kv.value)
    name, address = str(info.get("name", "")), str(info.get("address", ""))
    mine = bool(own_lease) and kv.lease == own_lease and name == own_name
    return GroupRole(kv.create_revision, name, address, mine)


class GroupMember:
    """One node's view of its group; made by ``join_group``."""

    def __init__(
        self,
        store: CoordStore,
        settings: MemberSettings,
        may_campaign: Callable[[], bool] | None = None,
        holds_data: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        # Whether this node's own data may lead (a replicated node: its copy is whole).
        self._may_campaign = may_campaign or (lambda: True)
        # Whether its copy holds any data at all (false: emptied): an unclean election's floor.
        self._holds_data = holds_data or (lambda: True)
        self._published_data: bool | None = None  # "data" in the member key as last put
        self.empty_copy_declines = 0  # stretches of refusing to lead with an empty copy
        self._declined_empty = False
        self._declined = False  # logged once per stretch of declining
        self.keys = GroupKeys(settings.prefix, settings.group)
        self._role = NO_LEADER
        self._changed = anyio.Event()
        self._wake = anyio.Event()
        self._lease_gone = anyio.Event()  # the keepalive thread found the lease expired
        self._unreachable = False  # the last keepalive could not reach etcd (logged once)
        self._loop_seen = time.monotonic()  # when the event loop last ran _tick (the keeper reads)
        self._keeper: LeaseKeeper | None = None  # sends the keepalives (join_group starts it)
        self._lease = 0
        # time.monotonic() until which the lease surely holds: written by the keeper's thread
        # (one float store) and by the loop, read by both and by the metrics' thread.
        self._lease_deadline = 0.0
        self._in_sync: list[str] = []
        self.elections_won = 0
        self.leadership_given_up = 0  # times this node gave the key back (promotion failed)
        self._hold_until = 0.0  # time.monotonic() before which it does not campaign
        self._given_up_epoch = 0  # a read of that key under way is not taken as leading
        self._gave_up_logged = False  # logged once per stretch of failed promotions
        # The in-sync set this node's last campaign replaced (None: the group had none), for
        # a leader that gives up before it served anything (give_up).
        self._in_sync_before: list[str] | None = None
        # The lease deadline passed while leading: no writes until a keepalive renews it.
        # A plain attribute: metrics read it from their HTTP thread.
        self.fenced = False
        self._listeners: list[Callable[[GroupRole], None]] = []

    # -- what the broker reads -------------------------------------------------------------
    @property
    def role(self) -> GroupRole:
        return self._role

    @property
    def in_sync(self) -> list[str]:
        """The in-sync set as last read (the leader's own writes included)."""
        return list(self._in_sync)

    async def role_changed(self) -> GroupRole:
        """Wait for the next change of ``role``; the new value."""
        await self._changed.wait()
        return self._role

    def on_change(self, listener: Callable[[GroupRole], None]) -> None:
        self._listeners.append(listener)

    def may_write(self) -> bool:
        """True while this node is the leader and its lease surely holds (the fence)."""
        return self._role.is_leader and self._lease_holds()

    def _lease_holds(self) -> bool:
        return time.monotonic() < self._lease_deadline

    def lease_remaining_s(self) -> float:
        return max(0.0, self._lease_deadline - time.monotonic())

    # -- what replication calls -------------------------------------------------------------
    async def set_in_sync(self, members: list[str]) -> bool:
        """Replace the in-sync set, only if this node still leads at its epoch (a deposed
        leader's change fails: False). The leader itself is always kept in the set."""
        role = self._role
        if not role.is_leader:
            return False
        members = sorted({self.settings.name, *members})
        result = await self.store.txn(
            [Compare(self.keys.leader, "create", role.epoch)],
            [Put(self.keys.in_sync, encode({"members": members}))],
        )
        if result.succeeded:
            self._in_sync = members
        else:
            self._wake.set()  # someone else leads: find out at once
        return result.succeeded

    async def give_up(self, epoch: int, why: str, *, served: bool) -> bool:
        """This node won ``epoch`` but cannot lead (its promotion failed): delete the leader
        key so another node is elected, and campaign again only after ``give_up_hold_s``.

        When it served nothing (``served`` false: no write was acknowledged in its epoch),
        the in-sync set its campaign replaced by itself alone is put back, so the nodes that
        were in sync may lead: they hold everything acknowledged. Once it served, the set
        stays (what replication added holds its epoch's writes). False if the key was no
        longer its own at ``epoch``."""
        role = self._role
        if not role.is_leader or role.epoch != epoch:
            return False
        settings, keys = self.settings, self.keys
        self._given_up_epoch = epoch
        hold_s = settings.give_up_hold_s
        self._hold_until = time.monotonic() + (2 * settings.lease_ttl_s if hold_s is None
                                               else hold_s)  # fmt: skip
        level = logging.DEBUG if self._gave_up_logged else logging.ERROR
        self._gave_up_logged = True
        log.log(level, "%s cannot lead group %s (epoch %d): %s; it gives up the leadership "
                "so another in-sync node is elected (popmq_ha_leadership_given_up)",
                settings.name, settings.group, epoch, why)  # fmt: skip
        ours = Compare(keys.leader, "create", epoch)
        deleted = False
        try:
            if not served:
                alone = Compare(keys.in_sync, "value", encode({"members": [settings.name]}))
                before = self._in_sync_before
                back: Put | Delete = (Delete(keys.in_sync) if before is None else
                                      Put(keys.in_sync, encode({"members": before})))  # fmt: skip
                result = await self.store.txn([ours, alone], [Delete(keys.leader), back])
                deleted = result.succeeded
            if not deleted:
                deleted = (await self.store.txn([ours], [Delete(keys.leader)])).succeeded
        except BaseException:
            self._given_up_epoch = 0  # the key may still be its own: a read says so
            raise  # (the node tries again: counted once it went through)
        self.leadership_given_up += 1
        self._publish(NO_LEADER)
        self._wake.set()  # read who leads now
        return deleted

    async def report_lag(self, node: str, lag_bytes: int, lag_s: float) -> None:
        """Publish a follower's replication lag (for `popmq admin cluster status`), bound to
        this node's lease so it disappears with it."""
        value = encode({"lag_bytes": lag_bytes, "lag_s": lag_s, "reported_by": self.settings.name})
        await self.store.put(self.keys.lag(node), value, self._lease)

    # -- internals --------------------------------------------------------------------------
    def _publish(self, role: GroupRole) -> None:
        if role == self._role:
            return
        previous, self._role = self._role, role
        if role.is_leader and not previous.is_leader:
            log.info("%s leads group %s at epoch %d", self.settings.name, self.settings.group,
                     role.epoch)  # fmt: skip
        elif previous.is_leader and not role.is_leader:
            log.warning("%s no longer leads group %s (epoch %d)", self.settings.name,
                        self.settings.group, previous.epoch)  # fmt: skip
        self.fenced = False
        if role.has_leader and not role.is_leader:
            self._gave_up_logged = False  # another node leads: a next failure is news
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        for listener in self._listeners:
            listener(role)

    def _step_down(self, why: str) -> None:
        if self._role.is_leader:
            log.warning("%s fences itself in group %s: %s", self.settings.name,
                        self.settings.group, why)  # fmt: skip
            self._publish(NO_LEADER)

    def _fence(self, why: str) -> None:
        """The deadline passed while leading: may_write() already refuses; say so once, and
        read the group at once (the key may be gone, or still ours)."""
        if self._role.is_leader and not self.fenced:
            log.warning("%s fences itself in group %s: %s; it leads again if a keepalive "
                        "finds its lease alive", self.settings.name, self.settings.group,
                        why)  # fmt: skip
            self.fenced = True
            self._wake.set()

    def _unfence(self) -> None:
        if self.fenced and self.may_write():
            log.info("%s renewed its lease: it leads group %s again (epoch %d)",
                     self.settings.name, self.settings.group, self._role.epoch)  # fmt: skip
            self.fenced = False

    async def _register(self) -> None:
        ttl = self.settings.lease_ttl_s
        sent = time.monotonic()
        lease = await self.store.grant(ttl)
        await self._put_member(lease)
        self._lease, self._lease_deadline = lease, sent + ttl
        self._wake.set()

    async def _put_member(self, lease: int) -> None:
        data = self._holds_data()
        member = encode({"name": self.settings.name, "address": self.settings.address,
                         "data": data})  # fmt: skip
        await self.store.put(self.keys.member(self.settings.name), member, lease)
        self._published_data = data

    async def _keep_lease(self) -> None:
        """Register (a lease and the member key), again whenever the lease is found lost; the
        keepalives themselves go from the keeper's thread (``LeaseKeeper``)."""
        while True:
            try:
                if not self._lease:
                    await self._register()
                    self._renewed()  # etcd answered: "reaches etcd again" if it did not
                with anyio.move_on_after(self.settings.lease_ttl_s / 3):  # or look again
                    await self._lease_gone.wait()
                self._lease_gone = anyio.Event()
            except CoordUnavailableError as exc:
                if not self._unreachable:  # once a stretch, not at every retry
                    log.warning("%s cannot register in etcd: %s", self.settings.name,
                                exc.message)  # fmt: skip
                    self._unreachable = True
                await anyio.sleep(self.settings.retry_s)

    # What the keeper's thread reports, run on the event loop (call_soon_threadsafe).
    def _renewed(self) -> None:
        if self._unreachable:
            log.info("%s reaches etcd again", self.settings.name)
            self._unreachable = False
        self._unfence()

    def _renewal_failed(self, lease: int, error: Exception) -> None:
        if lease != self._lease:
            return  # about a lease already replaced
        if isinstance(error, CoordUnavailableError) and not self._unreachable:
            log.warning("%s cannot reach etcd: %s", self.settings.name, error.message)
            self._unreachable = True
        if isinstance(error, LeaseLostError):
            log.warning("%s lost its lease; registering again", self.settings.name)
            self._lose_lease()
        elif not self.may_write():
            self._fence("its lease deadline passed without a keepalive")

    async def _tick(self) -> None:
        """Tell the keeper's thread the event loop still runs (see LeaseKeeper); after a
        stall, ask for a keepalive at once (less than a TTL may be left of the lease)."""
        while True:
            self._loop_seen = time.monotonic()
            if self._keeper is not None and self._keeper.stalled:
                self._keeper.renew_now()
            await anyio.sleep(self.settings.lease_ttl_s / 6)

    async def _fence_on_deadline(self) -> None:
        """Mark the fence when the lease deadline passes (may_write() already refuses from
        that instant; this tells the logs and the metrics, and reads the group at once)."""
        while True:
            if not self._role.is_leader:
                await self.role_changed()
            elif (remaining := self.lease_remaining_s()) > 0:
                await anyio.sleep(max(remaining, 0.01))
            else:
                self._fence("its lease deadline passed")
                await anyio.sleep(self.settings.retry_s)  # until a keepalive renews it

    async def _watch(self) -> None:
        while True:
            try:
                _, revision = await self.store.get_prefix(self.keys.root)
                async for _event in self.store.watch_prefix(self.keys.root, revision + 1):
                    self._wake.set()
            except CoordUnavailableError:
                await anyio.sleep(self.settings.retry_s)

    async def _elect(self) -> None:
        while True:
            with anyio.move_on_after(self.settings.poll_interval_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self._refresh()
            except LeaseLostError:
                self._lose_lease()
            except CoordUnavailableError:
                if not self.may_write():
                    self._fence("etcd is unreachable and its lease deadline passed")

    def _lose_lease(self) -> None:
        """etcd says the lease is gone: no longer the leader; register again at once."""
        self._lease = 0
        self._step_down("its lease expired")
        self._lease_gone.set()

    async def _refresh(self) -> None:
        kvs, _ = await self.store.get_prefix(self.keys.root)
        by_key = {kv.key: kv for kv in kvs}
        leader = by_key.get(self.keys.leader)
        if leader is not None and leader.create_revision == self._given_up_epoch:
            leader = None  # read before give_up deleted it: not leading again
        in_sync_kv = by_key.get(self.keys.in_sync)
        if self._lease and self._holds_data() != self._published_data:
            await self._put_member(self._lease)  # emptied, or bootstrapped since
        if leader is None and self._lease and self._eligible(in_sync_kv, kvs):
            await self._campaign(in_sync_kv)
            return
        if in_sync_kv is not None:
            self._in_sync = [str(m) for m in decode(in_sync_kv.value).get("members", [])]
        # Our key read back means our lease is alive at etcd now: still the leader, fenced
        # (may_write() false) until a keepalive renews the deadline.
        self._publish(leader_role(leader, self._lease, self.settings.name))

    def _eligible(self, in_sync_kv: KeyValue | None, kvs: list[KeyValue]) -> bool:
        if time.monotonic() < self._hold_until:
            return False  # it gave up its leadership a moment ago (give_up)
        if in_sync_kv is None:
            return True  # a new group's first leader
        if self.settings.unclean_election:  # the operator accepted losing the last writes
            if self._holds_data():
                self._declined_empty = False
                return True
            self._decline_empty(kvs)
            return False
        if self.settings.name not in decode(in_sync_kv.value).get("members", []):
            return False
        if not self._may_campaign():
            if not self._declined:
                log.warning("%s is in the in-sync set of group %s but its own copy is not "
                            "whole (emptied, or being reset or cut back): it does not campaign "
                            "until it has caught up", self.settings.name,
                            self.settings.group)  # fmt: skip
                self._declined = True
            return False
        self._declined = False
        return True

    def _decline_empty(self, kvs: list[KeyValue]) -> None:
        """An emptied copy never leads a group that had a leader, unclean or not: said once
        per stretch, loudly when no live node has data (the group cannot serve)."""
        if self._declined_empty:
            return
        self._declined_empty = True
        self.empty_copy_declines += 1
        members = self.keys.root + b"members/"
        with_data = sorted(
            str(info.get("name", "?"))
            for kv in kvs
            if kv.key.startswith(members)
            and (info := decode(kv.value)).get("data", True)
            and info.get("name") != self.settings.name
        )
        group = self.settings.group
        if with_data:
            log.warning("%s holds no data: it does not campaign in group %s while nodes with "
                        "data are live (%s)", self.settings.name, group,
                        ", ".join(with_data))  # fmt: skip
            return
        log.error("group %s has no leader and no live node with data: %s holds none (emptied "
                  "data directory) and will not lead, even with unclean election, since that "
                  "would start the group empty and reset any node that comes back with its "
                  "data. Bring back a node with its data directory; or, to give up the "
                  "group's data, stop its nodes, `popmq admin brokers remove %s --force`, and "
                  "start them again",
                  group, self.settings.name, group)  # fmt: skip

    async def _campaign(self, in_sync_kv: KeyValue | None) -> None:
        name = self.settings.name
        keys = self.keys
        result = await self.store.txn(
            [
                Compare(keys.leader, "create", 0),
                Compare(keys.in_sync, "mod", in_sync_kv.mod_revision if in_sync_kv else 0),
            ],
            [
                Put(keys.leader, self._leader_value(), self._lease),
                # The new leader alone is surely in sync; replication adds followers back.
                Put(keys.in_sync, encode({"members": [name]})),
            ],
        )
        if result.succeeded:
            self.elections_won += 1
            self._in_sync = [name]
            self._in_sync_before = (
                None if in_sync_kv is None
                else [str(m) for m in decode(in_sync_kv.value).get("members", [])]
            )  # fmt: skip
            # A keepalive now, while the broker is told and promotes: the lease then runs a
            # whole TTL from about the win, not from the last periodic keepalive (up to TTL/3
            # earlier; a loaded host's promotion outlasted the rest once, fenced the new
            # leader and cost a second election). Sent beside the promotion, not before it:
            # the promotion opens its store off the event loop, so the keepalives go on
            # meanwhile, and one etcd round trip less stands between the win and serving.
            if self._keeper is not None:
                self._keeper.renew_now()
            self._publish(GroupRole(result.revision, name, self.settings.address, True))
        else:
            self._wake.set()  # lost the race: read who won

    def _leader_value(self) -> bytes:
        return encode({"name": self.settings.name, "address": self.settings.address})

    async def _resign(self) -> None:
        lease, self._lease = self._lease, 0
        self._publish(NO_LEADER)
        if lease:
            with anyio.move_on_after(2, shield=True):
                try:
                    await self.store.revoke(lease)
                except CoordUnavailableError as exc:
                    log.warning("could not revoke lease at stop (it expires by itself): %s",
                                exc.message)  # fmt: skip


class LeaseKeeper:
    """Sends a member's keepalives from a thread of its own, every third of the TTL (at once
    when asked: a new leader's). The event loop only registers leases: a loop kept busy (a
    promotion, a flood of calls, a starved process's backlog of callbacks) no longer delays a
    keepalive past the lease deadline, fencing a healthy leader or losing its lease.

    Fencing is unchanged: the deadline moves to the keepalive's *send* time (taken in this
    thread just before the request) plus the TTL etcd grants, never later than etcd's own
    expiry. Failures are handed to the loop (``_renewal_failed``).

    Liveness: a loop that has not run for ``loop_stall_limit_s`` (2 TTLs by default) is
    taken as wedged: the keepalives stop until it runs again, so the lease expires and another
    node leads, as it did when the keepalives came from the loop itself. A wedged leader so
    holds its group at most 3 TTLs (4 TTLs as the bound held it up to 5, 15 s at the default
    lease: three times the failover goal), and a loop stall up to 8/3 of a TTL still keeps the
    lease (the last keepalive goes up to 2 TTLs into it). One TTL was too tight: a test
    process's loop on a loaded host stalled 2.3 s with a 2 s lease."""

    def __init__(self, member: GroupMember, loop: asyncio.AbstractEventLoop) -> None:
        self._member = member
        self._loop = loop
        self._poke = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"lease-{member.settings.name}", daemon=True
        )
        self.sent = 0  # keepalives sent (tests)
        self.stalled = False  # renewals held back: the event loop stalled
        self._ended: asyncio.Future[None] = loop.create_future()  # set as the thread ends

    def start(self) -> None:
        self._thread.start()

    async def aclose(self, timeout_s: float) -> None:
        """Stop the thread and wait (up to ``timeout_s``: a keepalive in flight) until it
        has ended, even if this task is cancelled meanwhile: an asyncio cancel pierces an
        AnyIO shield, and the thread outlived its member. The cancel is raised after."""
        self.stop()
        if not self._thread.is_alive() and not self._ended.done():
            return  # never started
        deadline = self._loop.time() + timeout_s
        cancelled: asyncio.CancelledError | None = None
        with anyio.CancelScope(shield=True):  # holds against AnyIO's cancels, not asyncio's
            while not self._ended.done() and (left := deadline - self._loop.time()) > 0:
                try:
                    await asyncio.wait([self._ended], timeout=left)  # never cancels _ended
                except asyncio.CancelledError as error:
                    cancelled = error
        if self._ended.done():
            self._thread.join()  # it has called back as its last step: ends at once
        else:
            log.warning("the lease keeper of %s did not stop within %.1f s (a keepalive "
                        "in flight)", self._member.settings.name, timeout_s)  # fmt: skip
        if cancelled is not None:
            raise cancelled

    def renew_now(self) -> None:
        self._poke.set()

    def stop(self) -> None:
        self._stopping = True
        self._poke.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self._keep()
        finally:
            self._call(_set_done, self._ended)

    def _keep(self) -> None:
        member, settings = self._member, self._member.settings
        wait_s = settings.lease_ttl_s / 3
        stall_limit_s = settings.loop_stall_limit_s or 2 * settings.lease_ttl_s
        while True:
            self._poke.wait(wait_s)
            self._poke.clear()
            if self._stopping:
                return
            wait_s = settings.lease_ttl_s / 3
            lease = member._lease
            if not lease:
                continue  # the loop registers a new one
            if (stalled_s := time.monotonic() - member._loop_seen) > stall_limit_s:
                if not self.stalled:
                    log.error("%s: its event loop has not run for %.1f s: no more keepalives "
                              "until it does (the lease expires; another node may lead)",
                              settings.name, stalled_s)  # fmt: skip
                self.stalled = True
                continue
            self.stalled = False
            sent = time.monotonic()
            self.sent += 1
            try:
                ttl = member.store.keepalive_blocking(lease)
            except (LeaseLostError, CoordUnavailableError) as error:
                if isinstance(error, CoordUnavailableError):
                    wait_s = settings.retry_s
                self._call(member._renewal_failed, lease, error)
                continue
            except Exception as error:  # a bug must not end the keepalives silently
                log.exception("keepalive of %s failed", settings.name)
                wait_s = settings.retry_s
                self._call(member._renewal_failed, lease, CoordUnavailableError(str(error)))
                continue
            if lease == member._lease:
                member._lease_deadline = max(member._lease_deadline, sent + ttl)
                self._call(member._renewed)

    def _call(self, callback: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the member is gone
            self._loop.call_soon_threadsafe(callback, *args)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@contextlib.asynccontextmanager
async def join_group(
    store: CoordStore,
    settings: MemberSettings,
    may_campaign: Callable[[], bool] | None = None,
    holds_data: Callable[[], bool] | None = None,
) -> AsyncIterator[GroupMember]:
    """Be a member of ``settings.group`` until the block ends (see the module's doc).
    ``may_campaign``: whether this node's own data may lead now (default: always);
    ``holds_data``: whether it holds any data (default: yes; false: never leads an existing
    group, even with unclean election)."""
    member = GroupMember(store, settings, may_campaign, holds_data)
    member._keeper = keeper = LeaseKeeper(member, asyncio.get_running_loop())
    keeper.start()
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(member._keep_lease)
            tasks.start_soon(member._watch)
            tasks.start_soon(member._elect)
            tasks.start_soon(member._fence_on_deadline)
            tasks.start_soon(member._tick)
            try:
                yield member
            finally:
                tasks.cancel_scope.cancel()
    finally:
        try:
            await keeper.aclose(2 * settings.lease_ttl_s)
        finally:
            await member._resign()
