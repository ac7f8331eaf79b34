"""The MQv2-HMAC-SHA1 signature as the official clients send it (forms taken from their code:
rocketmq-python-client 5.1.2 rocketmq/v5/util/signature.py, rocketmq-client-nodejs 1.0.8
dist/util/index.js)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from hashlib import sha1

import pytest

from popmq.security import signature
from popmq.security.acl import Acl
from popmq.security.authn import Authenticator
from popmq.security.errors import UNAUTHORIZED, AccessDenied

NOW = datetime(2026, 11, 23, 19, 0, 0, tzinfo=UTC).timestamp()
SK = "s3cr3t"


def python_client_headers(ak: str, sk: str, local: datetime) -> dict[str, str]:
    """Client 5.1.2: datetime.now() (local, naive) + 'Z', lower-case hex."""
    stamp = local.strftime("%Y%m%dT%H%M%SZ")
    digest = hmac.new(sk.encode(), stamp.encode(), sha1).hexdigest()
    return {
        "x-mq-date-time": stamp,
        "authorization": f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
        f"Signature={digest}",
    }


def node_client_headers(ak: str, sk: str, utc: datetime) -> dict[str, str]:
    """Client 1.0.8: toISOString() (UTC) without separators + 'Z', upper-case hex."""
    stamp = utc.strftime("%Y%m%dT%H%M%S") + "Z"
    digest = hmac.new(sk.encode(), stamp.encode(), sha1).hexdigest().upper()
    return {
        "x-mq-date-time": stamp,
        "authorization": f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
        f"Signature={digest}",
    }


@pytest.fixture
def utc_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _authn(skew_s: float = 900, any_timezone: bool = False) -> Authenticator:
    acl = Acl.model_validate({"users": [{"access_key": "app1", "secret_key": SK}]})
    verifier = signature.SignatureVerifier(skew_s, any_timezone, clock=lambda: NOW)
    return Authenticator(acl, verifier)


def _refused(authn: Authenticator, headers: dict[str, str]) -> str:
    with pytest.raises(AccessDenied) as err:
        authn.authenticate(headers)
    assert err.value.code == UNAUTHORIZED
    return err.value.message


def _at(offset: timedelta) -> datetime:
    return datetime.fromtimestamp(NOW, UTC) + offset


def test_both_official_forms_verify(utc_server: None) -> None:
    authn = _authn()
    assert authn.authenticate(node_client_headers("app1", SK, _at(timedelta()))).access_key
    local = datetime.fromtimestamp(NOW, UTC).replace(tzinfo=None)
    assert authn.authenticate(python_client_headers("app1", SK, local)).access_key == "app1"


def test_wrong_secret_unknown_key_and_missing_headers(utc_server: None) -> None:
    authn = _authn()
    now = _at(timedelta())
    wrong_secret = _refused(authn, node_client_headers("app1", "wrong", now))
    assert wrong_secret == _refused(authn, node_client_headers("bob", SK, now))  # see below
    assert "no credentials" in _refused(authn, {})
    # the Python client always sends the header, with an empty key when none is configured
    assert "malformed" in _refused(authn, python_client_headers("", "", now.replace(tzinfo=None)))
    headers = node_client_headers("app1", SK, now)
    del headers["x-mq-date-time"]
    assert "missing" in _refused(authn, headers)
    headers = node_client_headers("app1", SK, now)
    headers["authorization"] = headers["authorization"].replace("x-mq-date-time", "host")
    assert "SignedHeaders" in _refused(authn, headers)
    headers = node_client_headers("app1", SK, now)
    headers["x-mq-date-time"] = "yesterday"
    assert _refused(authn, headers) == wrong_secret  # signature first: no oracle


def _denial(authn: Authenticator, headers: dict[str, str]) -> AccessDenied:
    with pytest.raises(AccessDenied) as err:
        authn.authenticate(headers)
    return err.value


def test_unknown_key_and_wrong_secret_look_the_same_to_the_caller(
    utc_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'unknown access key' vs 'signature does not match' told a caller which access keys
    exist (and an unknown key returned before any HMAC, measurably faster). Now both answer
    one message after the same work; the server keeps the difference for its log and metric."""
    authn, now = _authn(), _at(timedelta())
    hmacs: list[str] = []
    real_sign = signature.sign
    monkeypatch.setattr(signature, "sign", lambda sk, dt: hmacs.append(dt) or real_sign(sk, dt))
    for stamp in (now, _at(timedelta(days=-1))):  # a stale date-time must not tell them apart
        unknown = _denial(authn, node_client_headers("bob", SK, stamp))
        wrong = _denial(authn, node_client_headers("app1", "wrong", stamp))
        assert unknown.code == wrong.code == UNAUTHORIZED
        assert unknown.message == wrong.message == "access key or signature not valid"
        assert "bob" not in unknown.message
        assert (unknown.reason, wrong.reason) == ("unknown_key", "bad_signature")
        assert "unknown access key 'bob'" in unknown.detail and SK not in unknown.detail
    assert len(hmacs) == 4  # one HMAC per attempt, known key or not


def test_clock_skew_window(utc_server: None) -> None:
    authn = _authn(skew_s=300)
    assert authn.authenticate(node_client_headers("app1", SK, _at(timedelta(seconds=299))))
    assert authn.authenticate(node_client_headers("app1", SK, _at(timedelta(seconds=-299))))
    late = node_client_headers("app1", SK, _at(timedelta(seconds=-301)))
    assert "clock skew" in _refused(authn, late)  # a replayed header from 5 min ago
    assert "clock skew" in _refused(
        authn, node_client_headers("app1", SK, _at(timedelta(seconds=301)))
    )


def test_python_client_in_the_servers_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+05:30, both sides
    time.tzset()
    try:
        local = datetime.fromtimestamp(NOW).replace(tzinfo=None)  # what datetime.now() gives
        assert _authn(skew_s=60).authenticate(python_client_headers("app1", SK, local))
    finally:
        monkeypatch.undo()
        time.tzset()


def test_python_client_in_another_zone_needs_any_timezone(utc_server: None) -> None:
    tokyo = datetime.fromtimestamp(NOW, timezone(timedelta(hours=9))).replace(tzinfo=None)
    headers = python_client_headers("app1", SK, tokyo)
    assert "clock skew" in _refused(_authn(skew_s=60), headers)
    assert _authn(skew_s=60, any_timezone=True).authenticate(headers)
    # still bounded: 9 h + 30 min is no zone offset, and 15 h is past UTC+14
    odd = datetime.fromtimestamp(NOW, UTC) + timedelta(hours=9, minutes=7)
    assert "clock skew" in _refused(
        _authn(skew_s=60, any_timezone=True),
        python_client_headers("app1", SK, odd.replace(tzinfo=None)),
    )
    far = datetime.fromtimestamp(NOW, UTC) + timedelta(hours=15)
    assert "clock skew" in _refused(
        _authn(skew_s=60, any_timezone=True),
        python_client_headers("app1", SK, far.replace(tzinfo=None)),
    )


def test_signed_metadata_is_what_the_verifier_accepts(utc_server: None) -> None:
    headers = dict(signature.signed_metadata("app1", SK, now=NOW))
    assert _authn().authenticate(headers).access_key == "app1"


def test_sign_is_each_call_s_own_hmac_with_the_key_state_reused() -> None:
    """The keyed HMAC state is made once per key and copied per call: no call's date-time may
    leak into the next one's digest, and each key keeps its own state."""
    stamps = ["20261123T190000Z", "20261123T190001Z", "20261123T190000Z"]
    for key in (SK, "another-key", SK):
        for stamp in stamps:
            expected = hmac.new(key.encode(), stamp.encode(), sha1).hexdigest()
            assert signature.sign(key, stamp) == expected


def test_a_malformed_authorization_header_is_refused_every_time() -> None:
    """The header's parse is remembered by its text: a malformed one is refused again, not
    taken from the memo as parsed."""
    headers = {"authorization": "MQv2-HMAC-SHA1 Credential=app1", "x-mq-date-time": "x"}
    for _ in range(2):
        with pytest.raises(AccessDenied) as refused:
            signature.parse(headers)
        assert refused.value.code == UNAUTHORIZED
