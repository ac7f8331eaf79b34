"""Receipt handles: sealed (AES-GCM) under a broker's own keys, routable without a key."""

import base64
import json
import os
import stat
from dataclasses import replace

import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.pop import handle_keys
from popmq.broker.pop.handle import HandleCodec, ReceiptHandle, group_hash, peek_broker_name
from popmq.broker.pop.handle_keys import HandleKeyring, KeyringError

from popmq.config import BrokerConfig


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


def _codec() -> HandleCodec:
    return HandleCodec(HandleKeyring(None))


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_round_trip_url_safe_and_opaque() -> None:
    codec = _codec()
    text = codec.encode(_handle())
    assert all(c.isalnum() or c in "-_." for c in text)
    assert codec.decode(text) == _handle()
    assert peek_broker_name(text) == "broker-a"
    sealed = _b64(text.split(".")[3])
    # nothing of the payload shows: no offset, topic, checkpoint id in clear
    for clear in (b"12345", b"orders", b"99000001"):
        assert clear not in sealed and clear.decode() not in text
    # two handles of the same entry differ (random nonce)
    assert codec.encode(_handle()) != text


def test_other_broker_key_rejected_but_routable() -> None:
    text = _codec().encode(_handle())
    with pytest.raises(RefusedError) as err:
        _codec().decode(text)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    assert "key unknown" in err.value.message
    assert peek_broker_name(text) == "broker-a"


def test_same_key_id_other_secret_rejected() -> None:
    key = handle_keys.new_key()
    forger = HandleKeyring(None, [replace(key, secret=os.urandom(32))])
    text = HandleCodec(forger).encode(_handle())
    with pytest.raises(RefusedError) as err:
        HandleCodec(HandleKeyring(None, [key])).decode(text)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    assert "does not open" in err.value.message


def test_altered_handle_rejected() -> None:
    codec = _codec()
    text = codec.encode(_handle())
    version, broker, key_id, sealed = text.split(".")
    raw = bytearray(_b64(sealed))
    raw[-1] ^= 1
    flipped = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    other_broker = base64.urlsafe_b64encode(b"broker-b").rstrip(b"=").decode()
    for forged in (f"{version}.{broker}.{key_id}.{flipped}", f"2.{other_broker}.{key_id}.{sealed}"):
        with pytest.raises(RefusedError) as err:
            codec.decode(forged)
        assert err.value.code == Code.INVALID_RECEIPT_HANDLE
        assert "does not open" in err.value.message


def test_any_broker_name() -> None:
    codec = _codec()
    text = codec.encode(_handle(broker="b~r.o/k+er é"))
    assert peek_broker_name(text) == "b~r.o/k+er é"
    assert codec.decode(text).broker == "b~r.o/k+er é"


@pytest.mark.parametrize(
    "text",
    ["", "abc", "a.b.c", "2.a.b", "2..k.s", "2.!!.k.s", "1.YQ.k.s", "2.YQ.k.s.t", "!!!.???"],
)
def test_malformed(text: str) -> None:
    with pytest.raises(RefusedError) as err:
        _codec().decode(text)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE


def test_old_version_one_handles_are_refused() -> None:
    payload = base64.urlsafe_b64encode(b"1~abc~t~0~5~1~2~3~0~broker-a").rstrip(b"=").decode()
    for read in (peek_broker_name, _codec().decode):
        with pytest.raises(RefusedError) as err:
            read(f"{payload}.c2ln")
        assert err.value.code == Code.INVALID_RECEIPT_HANDLE


def test_group_hash_distinguishes_groups() -> None:
    assert group_hash("g1") == group_hash("g1")
    assert group_hash("g1") != group_hash("g2")


def test_batch_encoding_opens_like_single() -> None:
    codec = _codec()
    h = _handle()
    batch = codec.encode_batch(
        h.broker, h.group_hash, h.topic, h.queue_id, [5, h.offset], h.pop_time_ms,
        h.invisible_until_ms, h.checkpoint_id,
    )  # fmt: skip
    assert codec.decode(batch[1]) == replace(h, index=1)
    assert codec.decode(batch[0]).offset == 5


# -- the keyring ------------------------------------------------------------------------------


def test_first_start_makes_a_private_random_key(tmp_path) -> None:
    config = BrokerConfig(name="b", data_dir=tmp_path / "b")
    ring = HandleKeyring.open(config)
    path = tmp_path / "b" / "handle-keys.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["active"] == ring.active_id
    assert len(base64.b64decode(data["keys"][0]["secret"])) == 32
    # a restart keeps it; another broker gets another key
    assert HandleKeyring.open(config).active_id == ring.active_id
    other = HandleKeyring.open(BrokerConfig(name="c", data_dir=tmp_path / "c"))
    assert other.active_id != ring.active_id


def test_rotation_keeps_old_handles_until_retired(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(handle_keys, "_RELOAD_EVERY_S", 0.0)
    config = BrokerConfig(name="b", data_dir=tmp_path)
    codec = HandleCodec(HandleKeyring.open(config))
    old_key = codec.keyring.active_id
    before = codec.encode(_handle())
    path = handle_keys.keyring_path(config)
    new = handle_keys.rotate(path)
    os.utime(path, ns=(1, 1))  # a distinct mtime even on coarse-clock filesystems
    after = codec.encode(_handle())
    assert after.split(".")[2] == new.key_id != old_key  # the running codec picked it up
    assert codec.decode(before) == codec.decode(after) == _handle()
    with pytest.raises(KeyringError):
        handle_keys.retire(path, new.key_id)  # never the active key
    handle_keys.retire(path, old_key)
    os.utime(path, ns=(2, 2))
    with pytest.raises(RefusedError) as err:
        codec.decode(before)
    assert err.value.code == Code.INVALID_RECEIPT_HANDLE and "retired" in err.value.message
    assert codec.decode(after) == _handle()


def test_keyring_from_a_given_file_is_never_written(tmp_path) -> None:
    missing = BrokerConfig(data_dir=tmp_path, handle_keys_file=tmp_path / "secret" / "keys.json")
    with pytest.raises(KeyringError):
        HandleKeyring.open(missing)
    assert not (tmp_path / "secret").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"active": "x", "keys": []}')
    with pytest.raises(KeyringError, match="active key"):
        HandleKeyring.open(BrokerConfig(data_dir=tmp_path, handle_keys_file=bad))


def test_remembered_broker_names_are_bounded_and_refuse_what_they_refused() -> None:
    """Broker parts are decoded once and remembered (every handle of an ack names the same
    broker); made-up ones cannot grow the memory past its bound, and a part that failed to
    decode is refused every time, never remembered."""
    from popmq.broker.pop import handle as handle_module

    codec = _codec()
    text = codec.encode(_handle())
    assert peek_broker_name(text) == peek_broker_name(text) == "broker-a"
    for i in range(handle_module._BROKER_NAMES_MAX * 3):
        name = base64.urlsafe_b64encode(f"made-up-{i}".encode()).rstrip(b"=").decode()
        assert peek_broker_name(f"2.{name}.k.s") == f"made-up-{i}"
        assert len(handle_module._BROKER_NAMES) <= handle_module._BROKER_NAMES_MAX
    for _ in range(2):
        with pytest.raises(RefusedError) as err:
            peek_broker_name("2.!!.k.s")
        assert err.value.code == Code.INVALID_RECEIPT_HANDLE
    assert "!!" not in handle_module._BROKER_NAMES
    assert codec.decode(text).broker == "broker-a"
