"""LocalBrokerPort's forwarded calls find the broker's method by its own name, also where the
method reports a qualified one (a mypyc-compiled Broker: "Broker.send")."""

from __future__ import annotations

from typing import Any

from popmq.broker.local import forward


class _Broker:
    async def send(self, *args: Any) -> str:
        return "sent"


class _Port:
    def __init__(self) -> None:
        self.broker = _Broker()

    send = forward(_Broker.send)


async def _qualified_send(self: Any, *args: Any) -> str:
    return "never called: the port calls its broker's method"


_qualified_send.__name__ = "Broker.send"  # as mypyc names a native class's method


class _CompiledStylePort(_Port):
    send = forward(_qualified_send)


async def test_a_forwarded_call_is_the_brokers_method() -> None:
    port = _Port()
    assert await port.send() == "sent"


async def test_a_qualified_method_name_still_finds_the_brokers_method() -> None:
    port = _CompiledStylePort()
    assert await port.send() == "sent"
