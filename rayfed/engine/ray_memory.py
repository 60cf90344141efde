"""Proportional set size of a ray run's processes, each named: the driver, the server and worker
actors, and Ray's own processes on their nodes.

Ray's processes of the run's session are found on a machine by their command lines, which name the
session's directory (the GCS server, the raylet, the dashboard, the monitors), and as children of
a raylet (its agents and idle workers, whose command lines Ray overwrites with titles). The driver
reads its own machine; for each other node, one of the run's actors on it reads its machine. A
process is known by (machine, pid), so a machine read twice (several raylets on one machine, as
ray.cluster_utils starts them) counts each process once. Processes of one kind (idle workers, the
raylets of several nodes) are summed under one name.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray

import rayfed.engine.process_memory as process_memory
from rayfed.engine.process_memory import pss

# The raylet's children that are Ray's, by title; the run's actors are named by their pids, and
# any other actor (another driver's) is not the run's.
RAYLET_CHILDREN = {b"ray::IDLE": "idle ray workers", b"ray::DashboardAgent": "dashboard_agent",
                   b"ray::RuntimeEnvAgent": "runtime_env_agent"}
# An actor that does not answer within this long (one being restarted) skips the sample.
PROBE_TIMEOUT_S = 10.0
UNREACHABLE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError)

Process = tuple[str, int]   # (machine, pid): pids are unique on one machine only


class MemoryProbe:
    """What each of the run's actors answers for `run_pss`."""

    def whereabouts(self) -> tuple[str, str, int]:
        return whereabouts()

    def machine_pss(self, named: dict[Process, str]) -> dict[Process, tuple[str, int]]:
        return machine_pss(named)


def run_pss(actors: dict[str, Any]) -> dict[str, int] | None:
    """{name: PSS in bytes} of the driver, the run's `actors` ({name: MemoryProbe actor}: the server,
    "worker 0", ...) and Ray's processes on their nodes, now; None when the driver's PSS cannot be read
    (no /proc) or an actor does not answer."""
    driver_node, here, driver = whereabouts()
    try:
        places = dict(zip(actors, ray.get([actor.whereabouts.remote() for actor in actors.values()],
                                          timeout=PROBE_TIMEOUT_S)))
        named = {(here, driver): "driver", **{(machine, pid): name for name, (_, machine, pid) in places.items()}}
        probes = {}
        for name, (node, _, _) in places.items():
            if node != driver_node:
                probes.setdefault(node, actors[name])
        remote = ray.get([actor.machine_pss.remote(named) for actor in probes.values()], timeout=PROBE_TIMEOUT_S)
    except UNREACHABLE:
        return None
    measured = machine_pss(named)
    if (here, driver) not in measured:
        return None
    for part in remote:
        measured.update(part)
    by_name: dict[str, int] = {}
    for name, size in measured.values():
        by_name[name] = by_name.get(name, 0) + size
    return by_name


def whereabouts() -> tuple[str, str, int]:
    """(Ray node id, machine, pid) of the calling process."""
    return ray.get_runtime_context().get_node_id(), _machine(), os.getpid()


def machine_pss(named: dict[Process, str]) -> dict[Process, tuple[str, int]]:
    """(name, PSS in bytes) of the processes on this machine that are the run's: those of `named`
    here, Ray's processes of the session, and the raylets' agents and idle workers."""
    here = _machine()
    names = {pid: name for (machine, pid), name in named.items() if machine == here}
    session = _session_dir()
    for pid, argv in _command_lines():
        if session is not None and session in argv and pid not in names:
            names[pid] = _program(argv)
    for raylet in [pid for pid, name in names.items() if name == "raylet"]:
        for child in _children(raylet):
            title = _command_line(child).split(b"\0")[0].strip()
            if child not in names and title in RAYLET_CHILDREN:
                names[child] = RAYLET_CHILDREN[title]
    measured = {}
    for pid, name in names.items():
        size = pss(pid)
        if size is not None:
            measured[(here, pid)] = (name, size)
    return measured


def _machine() -> str:
    try:
        return (process_memory.PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def _session_dir() -> bytes | None:
    node = ray._private.worker._global_node
    return None if node is None else os.fsencode(node.get_session_dir_path())


def _command_line(pid: int) -> bytes:
    try:
        return (process_memory.PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _command_lines():
    try:
        entries = os.listdir(process_memory.PROC)
    except OSError:
        return
    for entry in entries:
        if entry.isdigit():
            yield int(entry), _command_line(int(entry))


def _program(argv: bytes) -> str:
    """A daemon's name: its Python script (log_monitor.py: log_monitor), or its executable (raylet)."""
    arguments = [argument for argument in argv.split(b"\0") if argument]
    scripts = [argument for argument in arguments if argument.endswith(b".py")]
    return Path(os.fsdecode(scripts[0] if scripts else arguments[0])).stem


def _children(pid: int) -> list[int]:
    """Every thread of a process may start children; each thread lists its own."""
    children = []
    try:
        threads = os.listdir(process_memory.PROC / str(pid) / "task")
    except OSError:
        return children
    for thread in threads:
        try:
            children += map(int, (process_memory.PROC / str(pid) / "task" / thread / "children").read_text().split())
        except OSError:
            continue
    return children
