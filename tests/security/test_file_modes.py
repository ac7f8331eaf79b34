"""Owner-only files: a broker's data directory and everything in it is its owner's only
(0700 / 0600), and a secret file readable by others gets a WARNING at start.

Before, the data directory and its files (commit log, index, metadata, state) were 0755 /
0644: any local user could read every message body."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from popmq.broker.contract.types import Message
from support.official_clients import PopmqProcess, serve

from popmq.client.security import ClientSecurity
from popmq.client.sync import Client
from popmq.security.files import exposure, warn_if_exposed

pytestmark = pytest.mark.subprocess  # starts popmq or another process

KEYS = ("app1", "app1-secret-0001")
ACL = f"""users:
  - access_key: {KEYS[0]}
    secret_key: {KEYS[1]}
    admin: true
"""


def _modes(root: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def test_served_data_is_owner_only_and_a_readable_acl_file_is_reported(tmp_path: Path) -> None:
    acl = tmp_path / "acl.yaml"
    acl.write_text(ACL)
    acl.chmod(0o644)  # as `echo > acl.yaml` leaves it under the usual umask 022
    data = tmp_path / "data"
    process = serve(data, brokers=1, extra_args=["--acl", str(acl)])
    try:
        port = process.wait_listening()
        security = ClientSecurity(access_key=KEYS[0], secret_key=KEYS[1])
        with Client(f"127.0.0.1:{port}", security=security) as client:
            (receipt,) = client.send([Message(topic="modes", body=b"secret body")])
            assert receipt.code == 20000, receipt
    finally:
        assert process.stop() == 0
    modes = _modes(data)
    assert any("commitlog" in name for name in modes), sorted(modes)  # data was written
    assert any(name.endswith("handle-keys.json") for name in modes), sorted(modes)
    loose = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode & 0o077  # anything for group or others
    }
    assert loose == {}, loose
    log = process.log_path.read_text()
    (line,) = [x for x in log.splitlines() if "ACL file" in x and "readable by" in x]
    assert "WARNING" in line and str(acl) in line and "0644" in line
    assert KEYS[1] not in log  # never the secret


def test_broker_warns_once_for_a_readable_cluster_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("cluster-token-0123456789")
    token.chmod(0o640)  # our own file, readable by its group: not needed, so reported
    data = tmp_path / "b"  # made by an earlier version (umask 022): reported, left as it is
    data.mkdir()
    data.chmod(0o755)
    process = PopmqProcess(
        ["broker", "--name", "b", "--port", "0", "--data-dir", str(data),
         "--cluster-token-file", str(token)],
        tmp_path / "broker.log",
    )  # fmt: skip
    try:
        process.wait_listening("broker")
    finally:
        assert process.stop() == 0
    log = process.log_path.read_text()
    warned = [x for x in log.splitlines() if "cluster token file" in x and "readable by" in x]
    assert len(warned) == 1 and "its group" in warned[0] and "0640" in warned[0]
    assert "cluster-token-0123456789" not in log
    (old_dir,) = [x for x in log.splitlines() if "data directory" in x]
    assert "WARNING" in old_dir and "readable by everyone (mode 0755)" in old_dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o755
    loose = {name: oct(mode) for name, mode in _modes(data).items() if name != "." and mode & 0o077}
    assert loose == {}, loose  # what it created inside is owner-only
    assert stat.S_IMODE((data / "handle-keys.json").stat().st_mode) == 0o600


def test_exposure_rules(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = tmp_path / "s"
    secret.write_text("x")
    for mode, expected in ((0o600, None), (0o400, None), (0o640, "its group"),
                           (0o604, "everyone"), (0o644, "everyone")):  # fmt: skip
        secret.chmod(mode)
        assert exposure(secret) == expected, oct(mode)
    assert exposure(tmp_path / "missing") is None  # the reader reports that itself
    with caplog.at_level(logging.WARNING, logger="popmq.security.files"):
        assert warn_if_exposed(secret, "test file") and warn_if_exposed(secret, "test file")
    assert len([r for r in caplog.records if "readable by everyone" in r.getMessage()]) == 1


async def test_an_embedded_store_writes_owner_only_files_under_any_umask(
    tmp_path: Path, store_factory_umask: None
) -> None:
    """A broker embedded in another process keeps that process's umask (022, say): the store
    creates its files 0600 itself, so message bodies are not readable by other users."""
    from popmq.broker.store import MessageStore

    from popmq.config import StoreConfig

    store = MessageStore(tmp_path / "data", "embedded", StoreConfig())
    store.open()
    try:
        store.create_topic("T", 2)
        await store.append("T", 0, [Message("T", b"secret body", tag="x")])
        await store.flush()
        await store.checkpoint()
    finally:
        await store.aclose()
    files = {name: mode for name, mode in _modes(tmp_path / "data").items()
             if (tmp_path / "data" / name).is_file() and name != "LOCK"}  # fmt: skip
    assert files, "the store wrote no files"
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    readable = {name: oct(mode) for name, mode in files.items() if mode & 0o077}
    assert readable == {}


@pytest.fixture
def store_factory_umask() -> Iterator[None]:
    import os

    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_a_readable_tls_private_key_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ACL, the cluster token and the handle keys were checked at start, the TLS private
    keys (the proxy's, a broker's, the proxy's client key for mutual TLS) were not."""
    from support.tls_certs import make_pki

    from popmq.security.tls import channel_credentials, server_credentials

    pki = make_pki(tmp_path / "pki")  # keys written 0600
    with caplog.at_level(logging.WARNING, logger="popmq.security.files"):
        server_credentials(pki.server_cert, pki.server_key)
        channel_credentials(pki.ca, pki.client_cert, pki.client_key)
        assert caplog.records == []
        pki.server_key.chmod(0o644)
        pki.client_key.chmod(0o640)
        server_credentials(pki.server_cert, pki.server_key)
        channel_credentials(pki.ca, pki.client_cert, pki.client_key)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert f"TLS private key {pki.server_key} is readable by everyone (mode 0644)" in warned[0]
    assert f"client TLS key {pki.client_key} is readable by its group" in warned[1]
    assert "BEGIN" not in " ".join(warned)  # never the key itself
