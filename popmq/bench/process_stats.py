"""CPU time and memory of a process (psutil), for benchmark figures."""

from __future__ import annotations

import psutil


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of `pid` (this process when None); 0 when it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def rss_mib(pid: int) -> float:
    """Resident memory of `pid` in MiB; 0 when it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss / (1024 * 1024)
    except psutil.Error:
        return 0.0
