"""broker.contract.errors.Code is the protocol's apache.rocketmq.v2.Code, value for value."""

from __future__ import annotations

from popmq.broker.contract.errors import Code, RefusedError

from popmq.pb.rocketmq.v2 import definition_pb2


def test_every_code_has_the_protocol_value() -> None:
    wire = definition_pb2.Code
    for code in Code:
        assert wire.Value(code.name) == code.value, code.name


def test_every_protocol_code_exists_in_errors() -> None:
    ours = {code.name: code.value for code in Code}
    for name, number in definition_pb2.Code.items():
        if name == "CODE_UNSPECIFIED":
            continue
        assert ours.get(name) == number, name


def test_broker_error_keeps_code_and_message() -> None:
    error = RefusedError(Code.INVALID_RECEIPT_HANDLE, "handle expired")
    assert error.code == 40013 and error.message == "handle expired"
    assert "INVALID_RECEIPT_HANDLE" in str(error)
