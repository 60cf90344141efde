"""Which of a sweep's trials run as one pack (rayfed.engine.pack, `rayfed sweep --pack N`).

Trials pack when their runs batch together: vectorised (engine.vectorize) on the local engine, and
their configs equal but for the seed and float values (learning rates, momenta, mu, alpha, ...).
Integers and everything else (the model, the data, N, S, the rounds, the local steps, the algorithm)
decide the shape of the computation or what it is, so trials that differ there run in packs of their own.
"""
from __future__ import annotations

from typing import Any

from rayfed.config import Config
from rayfed.sweep.spec import Trial

# Trials per pack unless `rayfed sweep --pack` says otherwise.
DEFAULT_PACK = 32


def pack_key(config: Config) -> Any:
    """Trials with equal keys pack; None: the trial runs alone."""
    if not (config.engine.vectorize and config.engine.backend == "local"):
        return None
    settings = config.to_dict()
    settings.pop("seed")
    return repr(_without_floats(settings))


def _without_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_floats(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_floats(item) for item in value]
    return "<float>" if isinstance(value, float) else value


def packs(trials: list[Trial], limit: int) -> list[list[Trial]]:
    """The trials in packs of at most `limit`, each pack's trials alike (pack_key), in the trials' order
    of first appearance."""
    groups: dict[Any, list[list[Trial]]] = {}
    order: list[list[Trial]] = []
    for trial in trials:
        key = pack_key(trial.config)
        open_packs = groups.setdefault(key, []) if key is not None else []
        if key is None or not open_packs or len(open_packs[-1]) >= limit:
            pack: list[Trial] = []
            order.append(pack)
            if key is not None:
                open_packs.append(pack)
        (open_packs[-1] if key is not None else order[-1]).append(trial)
    return order
