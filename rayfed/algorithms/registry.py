"""Algorithm names, the hyper-parameters each one takes, and construction from a config."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from rayfed.algorithms.base import Algorithm
from rayfed.algorithms.fedavg import FedAvgM
from rayfed.algorithms.gradma import GradMA
from rayfed.algorithms.mifa import MIFA
from rayfed.errors import ConfigError

# Keys of AlgorithmConfig that every algorithm takes; the others are per-algorithm.
COMMON_KEYS = ("name", "lr_local", "lr_global", "agg_weighting")


@dataclass(frozen=True)
class AlgorithmEntry:
    build: Callable[..., Algorithm]
    defaults: dict[str, Any]                              # the algorithm's own config keys and their defaults
    fixed: dict[str, Any] = field(default_factory=dict)   # constructor arguments pinned by the name
    weighted: bool = True                                 # whether algorithm.agg_weighting applies


_QP_LOCAL = {"anchor_mode": "last_local", "qp_scope": "model", "qp_margin_local": 0.0}
_QP_GLOBAL = {"beta1": 0.5, "beta2": 0.5, "memory_size": 100, "qp_scope": "model", "qp_margin_global": 0.0}

ALGORITHMS: dict[str, AlgorithmEntry] = {
    "fedavg": AlgorithmEntry(FedAvgM, {}, {"beta1": 0.0, "mu": 0.0}),
    "fedavgm": AlgorithmEntry(FedAvgM, {"beta1": 0.9}, {"mu": 0.0}),
    "fedprox": AlgorithmEntry(FedAvgM, {"mu": 0.01}, {"beta1": 0.0}),
    "fedproxm": AlgorithmEntry(FedAvgM, {"beta1": 0.9, "mu": 0.01}),
    # MIFA averages the latest updates of all N clients: there is no weighting to choose.
    "mifa": AlgorithmEntry(MIFA, {}, {"beta1": 0.0}, weighted=False),
    "mifam": AlgorithmEntry(MIFA, {"beta1": 0.5}, weighted=False),
    "gradma_w": AlgorithmEntry(GradMA, _QP_LOCAL, {"correct_locally": True, "memory_size": 0, "beta1": 0.0}),
    "gradma_s": AlgorithmEntry(GradMA, _QP_GLOBAL, {"correct_locally": False}),
    "gradma": AlgorithmEntry(GradMA, {**_QP_GLOBAL, **_QP_LOCAL}, {"correct_locally": True}),
}

RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "beta1": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "beta2": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "mu": (lambda v: v >= 0.0, ">= 0"),
    "memory_size": (lambda v: v >= 0, ">= 0 (0: no memory)"),
    "anchor_mode": (lambda v: v in ("last_local", "global"), "one of: last_local, global"),
    "qp_scope": (lambda v: v in ("model", "tensor"), "one of: model, tensor"),
    "qp_margin_local": (lambda v: v >= 0.0, ">= 0"),
    "qp_margin_global": (lambda v: v >= 0.0, ">= 0"),
}


def resolve_hyperparameters(algorithm_config) -> None:
    """Fills the algorithm's defaults into unset keys, in place; a key set for an algorithm
    that does not take it is an error rather than silently ignored."""
    entry = ALGORITHMS[algorithm_config.name]
    if not entry.weighted and algorithm_config.agg_weighting != "uniform":
        raise ConfigError(f"algorithm.agg_weighting={algorithm_config.agg_weighting} does not apply to "
                          f"{algorithm_config.name}, which averages the latest updates of all clients")
    for key in vars(algorithm_config):
        if key in COMMON_KEYS:
            continue
        value = getattr(algorithm_config, key)
        if key in entry.defaults:
            if value is None:
                setattr(algorithm_config, key, entry.defaults[key])
            else:
                ok, allowed = RANGES[key]
                if not ok(value):
                    raise ConfigError(f"algorithm.{key}={value!r} must be {allowed}")
        elif value is not None:
            takes = ", ".join(f"algorithm.{k}" for k in (*COMMON_KEYS[1:], *entry.defaults))
            raise ConfigError(f"algorithm.{key} is not a parameter of {algorithm_config.name} (it takes {takes})")


def build_algorithm(algorithm_config, local_steps: int, param_blocks: list[tuple[int, int]]) -> Algorithm:
    entry = ALGORITHMS[algorithm_config.name]
    arguments = {key: getattr(algorithm_config, key) for key in entry.defaults}
    arguments.update(entry.fixed)
    if entry.weighted:
        arguments["agg_weighting"] = algorithm_config.agg_weighting
    if entry.build is GradMA:
        arguments["param_blocks"] = param_blocks
    return entry.build(lr_local=algorithm_config.lr_local, lr_global=algorithm_config.lr_global,
                       local_steps=local_steps, **arguments)
