"""A serving process's collector settings (popmq.gc_tuning): frozen start-up objects, a large
young generation and rare full collections (idle long polls made the collector a fifth of the
proxy's CPU)."""

import gc

from popmq.gc_tuning import tune_for_serving


def test_tuning_freezes_startup_objects_and_raises_thresholds() -> None:
    before = gc.get_threshold()
    try:
        tune_for_serving()
        young, middle, old = gc.get_threshold()
        assert young >= 10_000  # the default 700 collected every few hundred allocations
        assert young * middle * old >= 1_000_000  # full collections are rare, but still happen
        assert old > 0 and middle > 0
        assert gc.get_freeze_count() > 1_000  # the modules imported so far
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
