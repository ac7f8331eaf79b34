"""In-flight POP entries whose message left the store before they came due.

Retention deletes whole segments whatever is in flight (as RocketMQ does). An entry whose
message is gone when its lease ends, when it is released again or when a client forwards it
to the DLQ has nothing to deliver: it is finished (DROPPED), logged here and counted
(``CheckpointLedger.gone``, popmq_broker_inflight_gone_messages_total) - never silently.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# Why an in-flight entry finished without a delivery: its message had left the store.
GONE_REASON = "no longer in the store (retention removed it while it was in flight)"


def log_gone(group: str, topic: str, queue_id: int, offsets: list[int], when: str) -> None:
    """One line per batch: messages in flight whose bodies retention deleted are finished
    without a delivery (counted in popmq_broker_inflight_gone_messages_total)."""
    log.warning(
        "%d message(s) of %s queue %d at offset(s) %s, in flight for group %s and %s, are %s: "
        "finished without a delivery",
        len(offsets), topic, queue_id, _offsets_text(offsets), group, when, GONE_REASON,
    )  # fmt: skip


def _offsets_text(offsets: list[int]) -> str:
    shown = ", ".join(str(o) for o in offsets[:8])
    return shown + (f" (+{len(offsets) - 8} more)" if len(offsets) > 8 else "")
