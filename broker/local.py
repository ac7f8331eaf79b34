"""LocalBrokerPort: the BrokerPort of a Broker in the same process (plain method calls).

The port's calls are the Broker's own methods (``forward``): their signatures are written once,
in broker/core.py, and checked against the BrokerPort protocol by mypy.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, Generic, ParamSpec, TypeVar, overload

from popmq.broker.contract.watch import LocalWatchBackend
from popmq.broker.core import Broker

from popmq.lifecycle import AsyncClosing

if TYPE_CHECKING:
    from popmq.broker.contract.port import BrokerPort

P = ParamSpec("P")
R = TypeVar("R")


class forward(Generic[P, R]):
    """``port.send`` is ``port.broker.send``, typed as Broker.send is."""

    def __init__(self, method: Callable[Concatenate[Broker, P], Coroutine[Any, Any, R]]) -> None:
        # The method's own name: a mypyc-compiled Broker (scripts/mypyc_hot.py) names its
        # methods "Broker.send", as a __qualname__ would.
        self._name = method.__name__.rpartition(".")[2]

    @overload
    def __get__(self, port: None, owner: type[Any]) -> forward[P, R]: ...
    @overload
    def __get__(
        self, port: LocalBrokerPort, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __get__(
        self, port: LocalBrokerPort | None, owner: type[Any]
    ) -> forward[P, R] | Callable[P, Coroutine[Any, Any, R]]:
        if port is None:
            return self
        method: Callable[P, Coroutine[Any, Any, R]] = getattr(port.broker, self._name)
        return method


class LocalBrokerPort(AsyncClosing):
    """Every BrokerPort call goes to ``broker``. ``close()`` releases the port only; the
    broker's owner stops the broker."""

    # The broker's calls run on the caller's task (broker.contract.port.in_process).
    in_process: ClassVar[bool] = True

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._watches: LocalWatchBackend | None = None

    @property
    def watch_backend(self) -> LocalWatchBackend:
        """Visibility watches on this broker, waited for in process (no link to lose)."""
        if self._watches is None:
            self._watches = LocalWatchBackend(self)
        return self._watches

    @property
    def broker(self) -> Broker:
        return self._broker

    @property
    def name(self) -> str:
        return self._broker.name

    send = forward(Broker.send)
    recall = forward(Broker.recall)
    end_transaction = forward(Broker.end_transaction)
    claim_transaction_checks = forward(Broker.claim_transaction_checks)
    list_transactions = forward(Broker.list_transactions)
    pop = forward(Broker.pop)
    ack = forward(Broker.ack)
    change_invisible_time = forward(Broker.change_invisible_time)
    hand_back = forward(Broker.hand_back)
    notify = forward(Broker.notify)
    forward_to_dlq = forward(Broker.forward_to_dlq)
    pull = forward(Broker.pull)
    get_consumer_offset = forward(Broker.get_consumer_offset)
    update_consumer_offset = forward(Broker.update_consumer_offset)
    offset_for_timestamp = forward(Broker.offset_for_timestamp)
    create_topic = forward(Broker.create_topic)
    get_topic = forward(Broker.get_topic)
    list_topics = forward(Broker.list_topics)
    delete_topic = forward(Broker.delete_topic)
    get_group = forward(Broker.get_group)
    update_group = forward(Broker.update_group)
    group_stats = forward(Broker.group_stats)
    list_groups = forward(Broker.list_groups)
    delete_group = forward(Broker.delete_group)

    async def aclose(self) -> None:
        """Only the watches end; the broker keeps running."""
        watches, self._watches = self._watches, None
        if watches is not None:
            await watches.aclose()


if TYPE_CHECKING:  # mypy checks that the forwarded calls make a whole BrokerPort

    def _is_a_port(port: LocalBrokerPort) -> BrokerPort:
        return port
