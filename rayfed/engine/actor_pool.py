"""Actors kept from one run for the next (engine.reuse_actors), as Ray Tune's `reuse_actors` keeps its trials'.

Starting an actor starts a process that imports PyTorch and rayfed: seconds of CPU each, most of a small run's
start-up. With engine.reuse_actors, a run's server and workers that never died wait, idle, for the next run in
this process on the same Ray with the same actor options, which builds them again for its own config (their
constructors take nothing: a run's config, plugins and data reach them when it attaches them). While they wait
they hold their CPUs and GPUs: the next run that does not take them ends them, as do `release_actors()` and
`ray.shutdown()`.
"""
from __future__ import annotations

from typing import Any, Hashable

import ray

# Idle actors by their options, with the Ray session that holds them.
_idle: dict[Hashable, list[Any]] = {}
_session: str | None = None


def take(key: Hashable, count: int) -> list[Any]:
    """Up to `count` idle actors created with the options `key`, no longer idle."""
    idle = _idle_now()
    kept = idle.get(key, [])
    taken, idle[key] = kept[:count], kept[count:]
    return taken


def keep(key: Hashable, actors: list[Any]) -> None:
    """Keeps `actors`, created with the options `key`, idle for a later run."""
    _idle_now().setdefault(key, []).extend(actors)


def release_actors() -> None:
    """Ends the actors kept for a later run, freeing their CPUs and GPUs."""
    for actors in _idle_now().values():
        for actor in actors:
            ray.kill(actor)
    _idle.clear()


def _idle_now() -> dict[Hashable, list[Any]]:
    """The idle actors of the present Ray session: those kept in another (Ray shut down and started again) are
    forgotten, their handles naming nothing."""
    global _session
    session = _current_session()
    if session != _session:
        _idle.clear()
        _session = session
    return _idle


def _current_session() -> str | None:
    node = ray._private.worker._global_node if ray.is_initialized() else None
    return None if node is None else node.session_name
