"""Memory of the processes a run uses: each one's peak resident set (the driver, the server, the
workers), and the proportional set size of them all together (Ray's daemons included), sampled."""
from __future__ import annotations

import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Callable

# Where the kernel tells a process's memory; absent on macOS, where PSS is not reported.
PROC = Path("/proc")
# A sample reads the page tables of every process (~13 ms for one that imported torch): after one,
# the next waits this many times as long as it took, so sampling costs at most 1/50 of a run.
SAMPLE_SPACING = 50


def peak_rss() -> tuple[int, int]:
    """(pid, peak resident set size in bytes) of the calling process."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return os.getpid(), peak if sys.platform == "darwin" else peak * 1024   # Linux reports KiB


def reset_peak_rss() -> None:
    """The calling process's peak resident set starts over from its present size (Linux: clear_refs 5), so that
    an actor a later run reuses reports that run's peak; elsewhere it stays the process's."""
    try:
        (PROC / "self" / "clear_refs").write_text("5")
    except OSError:
        pass


def total_peak_rss(peaks: list[tuple[int, int]]) -> int:
    """The sum over distinct rayfed processes (not Ray's own daemons). Processes peak at different
    times and shared pages (Ray's object store) count once per process that touches them, so this
    overstates their joint peak."""
    return sum(dict(peaks).values())


def pss(pid: int) -> int | None:
    """Proportional set size of process `pid` in bytes: its private pages plus, of each page that k
    processes map, 1/k, so a sum over processes counts a shared page (Ray's object store, a shared
    library) once. None where the kernel does not tell (no /proc, the process gone, no permission)."""
    try:
        rollup = (PROC / str(pid) / "smaps_rollup").read_bytes()
    except OSError:
        return None
    for line in rollup.splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1]) * 1024      # in kB
    return None


def own_pss(name: str) -> dict[str, int] | None:
    """{name: PSS in bytes} of the calling process, or None where the kernel does not tell."""
    size = pss(os.getpid())
    return None if size is None else {name: size}


class PeakPss:
    """The largest sum of PSS over the run's processes seen at the ends of rounds, with each named
    process's part in that sample. `measure` returns {name: bytes} now, or None when it cannot
    (no /proc, or an actor unreachable at that moment: the sample is skipped)."""

    def __init__(self, measure: Callable[[], dict[str, int] | None]):
        self.measure = measure
        self.bytes: int | None = None
        self.by_process: dict[str, int] | None = None
        self.next_due = -math.inf

    def at_round_end(self) -> None:
        if time.perf_counter() >= self.next_due:
            self.sample()

    def sample(self) -> None:
        started = time.perf_counter()
        by_process = self.measure()
        finished = time.perf_counter()
        self.next_due = finished + SAMPLE_SPACING * (finished - started)
        if by_process is not None and (self.bytes is None or sum(by_process.values()) > self.bytes):
            self.bytes, self.by_process = sum(by_process.values()), dict(sorted(by_process.items()))
