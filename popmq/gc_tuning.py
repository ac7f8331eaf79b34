"""The cyclic garbage collector's settings for a serving process (`popmq proxy`, `popmq serve`).

A proxy holding 10,000 idle long polls keeps about 500,000 container objects alive, each poll
for up to its awaitDuration, and 500 of them end and start again every second. With Python's
default thresholds (700, 10, 10) that churn triggered a full collection every few seconds,
each walking every live object: a fifth of the proxy's CPU under `popmq bench idle` went to
the collector (measured with gc.callbacks: 4.5-5.3 s of 22-27 s), while full collections
found almost nothing to free (about 500 objects each; the young generations free the cycles
a receive leaves behind). A larger young generation and rarer full collections keep that
work small; the objects made while starting (modules, config, metrics) are frozen, so no
collection walks them again.

Full collections still happen (the 25% rule of CPython permitting, once every
``_THRESHOLDS[0] * [1] * [2]`` = 8 million net allocations instead of 70,000), so cyclic
garbage that reached the oldest generation stays bounded.
"""

from __future__ import annotations

import gc

# (young, middle, old): a young collection every 20,000 net allocations (not 700), a
# middle one every 20 of those, a full one at most every 20 middle ones.
_THRESHOLDS = (20_000, 20, 20)


def tune_for_serving() -> None:
    """Call once, after the imports and before serving: freeze what exists, raise thresholds."""
    gc.collect()  # nothing collectable gets frozen
    gc.freeze()
    gc.set_threshold(*_THRESHOLDS)
