"""Review (review-merge) of 0a877ef: a late pop's messages on a broker without HandBack are
released by a change of invisible time to 0 per handle; one handle the broker refuses must not
leave the others invisible (the proxy's own release, BrokerCalls._release, goes on)."""

from __future__ import annotations

from popmq.broker.contract.errors import BrokerTimeoutError, Code, RefusedError
from popmq.broker.contract.types import ChangeInvisibleResult
from popmq.broker.wire.remote import RemoteBrokerPort


class _OldBroker(RemoteBrokerPort):
    """No HandBack; the first change of invisible time fails (a transient timeout)."""

    def __init__(self) -> None:
        super().__init__("b0", "127.0.0.1:1")
        self.changed: list[str] = []

    async def hand_back(self, group: str, topic: str, receipt_handles: list[str]) -> int:
        raise RefusedError(Code.NOT_IMPLEMENTED, "this broker does not know HandBack")

    async def change_invisible_time(
        self, group: str, topic: str, receipt_handle: str, invisible_time_ms: int
    ) -> ChangeInvisibleResult:
        if receipt_handle == "h0":
            raise BrokerTimeoutError("b0", "no answer to change_invisible_time")
        self.changed.append(receipt_handle)
        return ChangeInvisibleResult(receipt_handle=receipt_handle, invisible_until_ms=0)


async def test_one_failed_change_does_not_keep_the_other_late_messages_invisible() -> None:
    port = _OldBroker()
    await port._hand_back_late("g", "t", ["h0", "h1", "h2"])
    # main (0a877ef): the loop ends at h0's error; h1 and h2 stay invisible for their whole
    # invisible time though the broker would have released them.
    assert port.changed == ["h1", "h2"]
