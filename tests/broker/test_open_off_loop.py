"""A promoted node opens its store off the event loop (``Broker.start(open_off_loop=True)``):
the loop keeps running what else it carries meanwhile (the node's lease keepalives, its etcd
watches). The open used to block that loop for its whole recovery walk (up to seconds on a
loaded host), so a new leader's keepalives waited on its own promotion."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from popmq.broker.core import Broker
from popmq.broker.store import MessageStore
from popmq.broker.testing import fast_broker_config


def open_waiting_for(
    loop_ran: threading.Event, opened_on: list[int], opened: threading.Event
) -> object:
    """MessageStore.open that first waits until a task of the event loop ran: on the loop it
    could not, and would give up after 5 s."""
    real_open = MessageStore.open

    def open_(store: MessageStore) -> None:
        opened_on.append(threading.get_ident())
        loop_ran.wait(5)
        real_open(store)
        opened.set()

    return open_


async def test_the_loop_runs_while_a_promoted_store_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_ran, opened, opened_on = threading.Event(), threading.Event(), []
    monkeypatch.setattr(MessageStore, "open", open_waiting_for(loop_ran, opened_on, opened))
    ran_during_open = False

    async def keepalive_stand_in() -> None:
        nonlocal ran_during_open
        while not opened_on:  # noqa: ASYNC110 (a worker thread appends: no event to await)
            await anyio.sleep(0.001)
        ran_during_open = not opened.is_set()
        loop_ran.set()

    broker = Broker(fast_broker_config(tmp_path / "data"))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(keepalive_stand_in)
        await broker.start(open_off_loop=True)
    try:
        assert ran_during_open  # the loop ran a task while the store was opening
        assert opened_on != [threading.get_ident()]  # a worker thread opened it
        assert broker.started
    finally:
        await broker.aclose()


async def test_a_promotion_cancelled_while_its_store_opens_leaves_it_to_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role change while the store opens off the loop: the open runs to its end and start()
    returns with the broker started (the cancellation lands at the caller's next
    checkpoint, inside ``_lead``'s try, whose finally closes it). Had the cancellation landed
    inside start() after the open, the store would stay open and locked with nobody to close
    it: the next role could not open the directory."""
    loop_ran, opened, opened_on = threading.Event(), threading.Event(), []
    monkeypatch.setattr(MessageStore, "open", open_waiting_for(loop_ran, opened_on, opened))
    broker = Broker(fast_broker_config(tmp_path / "data"))
    returned_started = False
    with anyio.CancelScope() as scope:
        try:
            async with anyio.create_task_group() as tasks:

                async def cancel_while_opening() -> None:
                    while not opened_on:  # noqa: ASYNC110 (a worker thread appends)
                        await anyio.sleep(0.001)
                    scope.cancel()
                    loop_ran.set()

                tasks.start_soon(cancel_while_opening)
                await broker.start(open_off_loop=True)
                returned_started = broker.started
                await anyio.lowlevel.checkpoint()  # the caller's next one: the cancellation
        finally:
            with anyio.CancelScope(shield=True):
                await broker.aclose()
    assert scope.cancelled_caught and returned_started and opened.is_set()
    monkeypatch.undo()
    again = Broker(fast_broker_config(tmp_path / "data"))  # the directory's lock was released
    await again.start()
    await again.aclose()
