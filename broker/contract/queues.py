"""The one rule that maps a FIFO message group to a queue, for the proxy and the broker alike.

A group's messages stay in order only while every send of the group lands on the same queue, so
the rule must never change under data already written: it is an 8-byte blake2b of the group's
UTF-8 bytes, read big-endian, modulo the number of queues (a stable hash, not ``hash()``, which
is salted per process).
"""

from __future__ import annotations

import hashlib


def queue_for_group(message_group: str, queue_count: int) -> int:
    """The index (0..queue_count-1) of the queue that message_group always goes to."""
    digest = hashlib.blake2b(message_group.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % queue_count
