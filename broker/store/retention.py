"""Retention: whole commitlog segments age out, and each queue's min offset follows."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from popmq.broker.store.commitlog import CommitLog
from popmq.broker.store.queue_index import QueueIndex

from popmq.config import StoreConfig

log = logging.getLogger(__name__)


def apply_retention(
    commitlog: CommitLog, indexes: Iterable[QueueIndex], config: StoreConfig, now_ms: int
) -> int:
    """Delete whole commitlog segments older than ``retention_hours`` (by last write) or
    beyond ``retention_bytes`` (oldest first); never the active one, nor one not yet
    fsynced. Queue min offsets move up at once; index files left empty go at the next
    checkpoint. Returns the commitlog bytes freed."""
    max_age_ms = config.retention_hours * 3_600_000
    max_bytes = config.retention_bytes
    freed = 0
    while len(segments := commitlog.segments) > 1:
        oldest = segments[0]
        if oldest.end > commitlog.durable_position:
            break
        too_old = now_ms - commitlog.segment_mtime_ms(oldest) > max_age_ms
        too_big = max_bytes > 0 and commitlog.total_bytes > max_bytes
        if not (too_old or too_big):
            break
        commitlog.delete_oldest()
        freed += oldest.size
        log.info("store: retention deleted commitlog segment %d (%d bytes)",
                 oldest.start, oldest.size)  # fmt: skip
    if freed:
        advance_min_offsets(commitlog, indexes)
    return freed


def advance_min_offsets(commitlog: CommitLog, indexes: Iterable[QueueIndex]) -> None:
    """Move each queue's min offset past the entries whose records retention deleted."""
    floor = commitlog.min_position
    for index in indexes:
        lo = max(index.min_offset, index.first_offset)
        index.min_offset = index.bisect(lo, index.max_offset, lambda e: e[0], floor)
