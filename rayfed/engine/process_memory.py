"""Peak resident memory of the processes a run uses (the driver, the server, the workers)."""
from __future__ import annotations

import os
import resource
import sys


def peak_rss() -> tuple[int, int]:
    """(pid, peak resident set size in bytes) of the calling process."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return os.getpid(), peak if sys.platform == "darwin" else peak * 1024   # Linux reports KiB


def total_peak_rss(peaks: list[tuple[int, int]]) -> int:
    """The sum over distinct rayfed processes (not Ray's own daemons). Processes peak at different
    times and shared pages (Ray's object store) count once per process that touches them, so this
    overstates their joint peak."""
    return sum(dict(peaks).values())
