import base64
from dataclasses import replace

import pytest
from popmq.broker.api.errors import BrokerError, Code
from popmq.broker.pop.handle import HandleCodec, ReceiptHandle, group_hash, peek_broker_name


def _handle(**changes: object) -> ReceiptHandle:
    fields: dict[str, object] = dict(
        broker="broker-a",
        group_hash=group_hash("g1"),
        topic="%RETRY%g1_orders",
        queue_id=3,
        offset=12345,
        pop_time_ms=1_700_000_000_000,
        invisible_until_ms=1_700_000_060_000,
        checkpoint_id=99_000_001,
        index=7,
    )
    fields.update(changes)
    return ReceiptHandle(**fields)  # type: ignore[arg-type]


def test_round_trip_and_url_safe() -> None:
    codec = HandleCodec("s3cret")
    text = codec.encode(_handle())
    assert all(c.isalnum() or c in "-_." for c in text)
    assert codec.decode(text) == _handle()
    assert peek_broker_name(text) == "broker-a"


def test_other_secret_rejected_as_forged() -> None:
    text = HandleCodec("other").encode(_handle())
    with pytest.raises(BrokerError) as err:
        HandleCodec("s3cret").decode(text)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    assert "signature" in err.value.message
    # routing still works without the secret
    assert peek_broker_name(text) == "broker-a"


def test_altered_payload_rejected() -> None:
    codec = HandleCodec("s3cret")
    payload, signature = codec.encode(_handle()).split(".")
    text = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    assert "~12345~" in text
    altered = text.replace("~12345~", "~12346~").encode()
    forged = base64.urlsafe_b64encode(altered).rstrip(b"=").decode()
    with pytest.raises(BrokerError) as err:
        codec.decode(f"{forged}.{signature}")
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    assert "signature" in err.value.message


def test_any_broker_name() -> None:
    codec = HandleCodec("s3cret")
    text = codec.encode(_handle(broker="b~r.o/k+er é"))
    assert peek_broker_name(text) == "b~r.o/k+er é"
    assert codec.decode(text).broker == "b~r.o/k+er é"


@pytest.mark.parametrize(
    "text",
    ["", "abc", "a.b.c", ".sig", "bm90IGpzb24.c2ln", "W10.c2ln", "WzIsImEiXQ.c2ln", "!!!.???"],
)
def test_malformed(text: str) -> None:
    with pytest.raises(BrokerError) as err:
        peek_broker_name(text)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    with pytest.raises(BrokerError) as err:
        HandleCodec("s").decode(text)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    assert "malformed" in err.value.message


def test_group_hash_distinguishes_groups() -> None:
    assert group_hash("g1") == group_hash("g1")
    assert group_hash("g1") != group_hash("g2")


def test_batch_encoding_matches_single() -> None:
    codec = HandleCodec("s3cret")
    h = _handle()
    batch = codec.encode_batch(
        h.broker, h.group_hash, h.topic, h.queue_id, [5, h.offset], h.pop_time_ms,
        h.invisible_until_ms, h.checkpoint_id,
    )  # fmt: skip
    assert batch[1] == codec.encode(replace(h, index=1))
    assert codec.decode(batch[0]).offset == 5


def test_peek_refuses_an_unknown_version_like_decode() -> None:
    codec = HandleCodec("s3cret")
    text = codec.encode(_handle())
    payload, signature = text.split(".")
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    forged = base64.urlsafe_b64encode(b"9" + raw[1:]).rstrip(b"=").decode() + "." + signature
    for read in (peek_broker_name, codec.decode):
        with pytest.raises(BrokerError) as err:
            read(forged)
        assert err.value.code == Code.INVALID_RECEIPT_HANDLE
        assert "unknown version" in err.value.message
