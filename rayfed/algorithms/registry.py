"""Algorithm names, the hyper-parameters each one takes, and construction from a config."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rayfed.algorithms.base import Algorithm
from rayfed.algorithms.fedavg import FedAvgM
from rayfed.errors import ConfigError

# Keys of AlgorithmConfig that every algorithm takes; the others are per-algorithm.
COMMON_KEYS = ("name", "lr_local", "lr_global", "agg_weighting")


@dataclass(frozen=True)
class AlgorithmEntry:
    build: Callable[..., Algorithm]
    defaults: dict[str, float]       # the algorithm's own keys and their defaults
    fixed: dict[str, float]          # keys pinned by the name (FedAvg is FedAvgM with beta1 = 0)
    summary: str


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "fedavg": AlgorithmEntry(FedAvgM, {}, {"beta1": 0.0, "mu": 0.0}, "local SGD, server averaging"),
    "fedavgm": AlgorithmEntry(FedAvgM, {"beta1": 0.9}, {"mu": 0.0}, "FedAvg + server momentum beta1"),
    "fedprox": AlgorithmEntry(FedAvgM, {"mu": 0.01}, {"beta1": 0.0}, "FedAvg + proximal term mu"),
    "fedproxm": AlgorithmEntry(FedAvgM, {"beta1": 0.9, "mu": 0.01}, {}, "FedProx + server momentum beta1"),
}

RANGES = {
    "beta1": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "mu": (lambda v: v >= 0.0, ">= 0"),
}


def resolve_hyperparameters(algorithm_config) -> None:
    """Fills the algorithm's defaults into unset keys, in place; a key set for an algorithm
    that does not take it is an error rather than silently ignored."""
    entry = ALGORITHMS[algorithm_config.name]
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
                    raise ConfigError(f"algorithm.{key}={value} must be {allowed}")
        elif value is not None:
            takes = ", ".join(f"algorithm.{k}" for k in (*COMMON_KEYS[1:], *entry.defaults))
            raise ConfigError(f"algorithm.{key} is not a parameter of {algorithm_config.name} (it takes {takes})")


def build_algorithm(algorithm_config, local_steps: int) -> Algorithm:
    entry = ALGORITHMS[algorithm_config.name]
    params = {key: getattr(algorithm_config, key) for key in entry.defaults}
    return entry.build(lr_local=algorithm_config.lr_local, lr_global=algorithm_config.lr_global,
                       local_steps=local_steps, agg_weighting=algorithm_config.agg_weighting,
                       **entry.fixed, **params)
