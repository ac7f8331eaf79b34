"""The forged-ack attack of issue 10, tried again: it fails and the message is redelivered.

The attack: take a real handle, re-seal it claiming ``invisible_until + 1h`` (possible before,
when every broker signed with the built-in ``popmq-dev-secret``), and ack it after the real
deadline passed, before revive ran; or guess handles. The broker now decides on the checkpoint's
own deadline, and handles are sealed with a key only it holds."""

import asyncio
from dataclasses import replace

from popmq.broker.contract.errors import Code
from popmq.broker.contract.types import AckEntry, Message, PopRequest
from popmq.broker.core import Broker
from popmq.broker.pop.handle import HandleCodec, group_hash
from popmq.broker.pop.handle_keys import HandleKeyring, keyring_path
from popmq.broker.testing import fast_broker_config, running_broker


async def test_reseal_with_a_later_deadline_and_guesses_fail_then_redelivered(
    tmp_path, monkeypatch
) -> None:
    revive_paused = True
    real_step = Broker._revive_step

    async def gated_step(self: Broker) -> float:
        # Holds revive back so the ack lands after the deadline but before the redelivery:
        # exactly the window the attack used.
        return 0.02 if revive_paused else await real_step(self)

    monkeypatch.setattr(Broker, "_revive_step", gated_step)
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.send([Message("t", b"order-1")], 0)
        (popped,) = (await broker.pop(PopRequest("g", "t", invisible_time_ms=50))).messages
        await asyncio.sleep(0.15)  # past the deadline (a lower bound only)

        # An insider with the broker's key re-seals the handle claiming a later deadline.
        codec = HandleCodec(HandleKeyring(keyring_path(broker.config)))
        claimed = codec.decode(popped.receipt_handle)
        resealed = codec.encode(
            replace(claimed, invisible_until_ms=claimed.invisible_until_ms + 3_600_000)
        )
        # A stranger guesses handles around the real checkpoint (another key: not ours).
        stranger = HandleCodec(HandleKeyring(None))
        guesses = [
            stranger.encode(replace(claimed, checkpoint_id=claimed.checkpoint_id + d, index=i))
            for d in range(-5, 6)
            for i in range(6)
        ]
        entries = [AckEntry(resealed, "m"), AckEntry(popped.receipt_handle, "m")]
        entries += [AckEntry(g, "m") for g in guesses]
        results = await broker.ack("g", "t", entries)
        assert [r.code for r in results] == [Code.INVALID_RECEIPT_HANDLE] * len(entries)
        assert "expired" in results[0].message

        revive_paused = False
        again = await broker.pop(PopRequest("g", "t", invisible_time_ms=5_000, poll_time_ms=5_000))
        assert [m.message.message_id for m in again.messages] == [popped.message.message_id]
        assert again.messages[0].delivery_attempt == 2


async def test_handle_of_another_group_or_broker_is_refused(tmp_path) -> None:
    async with (
        running_broker(fast_broker_config(tmp_path / "a", "broker-a")) as a,
        running_broker(fast_broker_config(tmp_path / "b", "broker-b")) as b,
    ):
        await a.send([Message("t", b"x")], 0)
        (popped,) = (await a.pop(PopRequest("g", "t", invisible_time_ms=10_000))).messages
        assert group_hash("g") not in popped.receipt_handle  # opaque
        (other_group,) = await a.ack("h", "t", [AckEntry(popped.receipt_handle)])
        (other_broker,) = await b.ack("g", "t", [AckEntry(popped.receipt_handle)])
        assert other_group.code == other_broker.code == Code.INVALID_RECEIPT_HANDLE
        (ok,) = await a.ack("g", "t", [AckEntry(popped.receipt_handle)])
        assert ok.code == Code.OK
