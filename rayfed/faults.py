"""engine.fault_injection: real faults at chosen moments of a ray run, for testing what survives what.

Entries (ROUND is 1-based, as in metrics.jsonl):
  kill:WORKER:ROUND[:WHEN]      the worker's process exits; WHEN is
                                  train      while it trains round ROUND (the default)
                                  delivered  after its uploads of round ROUND reached the server,
                                             before the round's checkpoint
                                  checkpoint while it hands over its client states for the
                                             checkpoint taken after round ROUND
                                  idle       after round ROUND, while it waits for the next one
                                  restart    in round ROUND's training, and again while it is
                                             being restarted
  delay:WORKER:ROUND:SECONDS    the worker stalls that long before training round ROUND
  kill_server:ROUND[:WHEN]      the server actor's process exits; WHEN is step (while it folds
                                round ROUND's uploads in, the default) or checkpoint

The driver schedules every fault and each fires once, so a fault does not fire again when a
recovered run repeats its round.
"""
from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

from rayfed.errors import ConfigError

WORKER_MOMENTS = ("train", "delivered", "checkpoint", "idle", "restart")
SERVER_MOMENTS = ("step", "checkpoint")
# A stall longer than a day is a typo, not a test.
MAX_DELAY_S = 86400.0
SERVER = -1


class Fault(NamedTuple):
    kind: str           # "kill" or "delay"
    target: int         # a worker index, or SERVER
    round: int          # 0-based
    when: str
    seconds: float


def parse_fault(entry: str, num_workers: int) -> Fault:
    parts = entry.split(":") if isinstance(entry, str) else []
    try:
        fault = _parse(parts)
    except (IndexError, ValueError, OverflowError):
        fault = None
    if fault is None or fault.round < 0 or not (fault.target == SERVER or 0 <= fault.target < num_workers):
        raise ConfigError(f"engine.fault_injection entry {entry!r} must be kill:WORKER:ROUND[:WHEN] "
                          f"(WHEN: {'|'.join(WORKER_MOMENTS)}), delay:WORKER:ROUND:SECONDS (0 < SECONDS <= "
                          f"{MAX_DELAY_S:g}) or kill_server:ROUND[:WHEN] (WHEN: {'|'.join(SERVER_MOMENTS)}), "
                          f"with 0 <= WORKER < engine.num_workers={num_workers} and ROUND >= 1")
    return fault


def _parse(parts: list[str]) -> Fault | None:
    kind = parts[0]
    if kind == "kill" and len(parts) in (3, 4):
        when = parts[3] if len(parts) == 4 else "train"
        return Fault("kill", int(parts[1]), int(parts[2]) - 1, when, 0.0) if when in WORKER_MOMENTS else None
    if kind == "delay" and len(parts) == 4:
        seconds = float(parts[3])
        if not (math.isfinite(seconds) and 0 < seconds <= MAX_DELAY_S):
            return None
        return Fault("delay", int(parts[1]), int(parts[2]) - 1, "train", seconds)
    if kind == "kill_server" and len(parts) in (2, 3):
        when = parts[2] if len(parts) == 3 else "step"
        return Fault("kill", SERVER, int(parts[1]) - 1, when, 0.0) if when in SERVER_MOMENTS else None
    return None


class FaultSchedule:
    """The run's faults by (target, round, moment). A `restart` kill fires at the round's training and
    again when the engine restarts the worker; every other fault fires once."""

    def __init__(self, entries: list[str], num_workers: int):
        self.pending: list[tuple[int, int, str, Fault, str]] = []
        for entry in entries:
            fault = parse_fault(entry, num_workers)
            if fault.when == "restart":
                self.pending.append((fault.target, fault.round, "train", fault, entry))
            self.pending.append((fault.target, fault.round, fault.when, fault, entry))

    def due(self, target: int, round: int, moment: str) -> list[Fault]:
        """The faults to enact now, removed from the schedule."""
        due = [entry for entry in self.pending if entry[:3] == (target, round, moment)]
        for entry in due:
            self.pending.remove(entry)
        return [entry[3] for entry in due]

    def awaits(self, round: int, moment: str) -> bool:
        """Whether a fault of any target is still to strike at `moment` of `round`."""
        return any(entry[1:3] == (round, moment) for entry in self.pending)

    def unfired(self) -> list[str]:
        """Entries whose moment never came (a worker with no clients that round, a round without a
        checkpoint): a test that relied on one must not pass silently."""
        return sorted({entry[4] for entry in self.pending})


def enact(fault: Fault) -> None:
    """Run inside the target actor's process."""
    if fault.kind == "kill":
        os._exit(1)         # what an OOM kill looks like from outside: the process is simply gone
    time.sleep(fault.seconds)
