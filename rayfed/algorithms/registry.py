"""Algorithm names, the hyper-parameters each one takes and the values they admit, and
construction from a config."""
from __future__ import annotations

import reprlib
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal

import annotated_types
from pydantic import Field, TypeAdapter, ValidationError

from rayfed.algorithms.base import Algorithm
from rayfed.algorithms.fedavg import FedAvgM
from rayfed.algorithms.fedgate import OWN_TERMS, FedGATE
from rayfed.algorithms.fedlalr import FedLALR
from rayfed.algorithms.fedmos import INIT_GRADS, FedMoS
from rayfed.algorithms.fedopt import FedOpt
from rayfed.algorithms.gradma import GradMA
from rayfed.algorithms.lafedopt import LaFedOPT
from rayfed.algorithms.mifa import MIFA
from rayfed.algorithms.scaffold import Scaffold
from rayfed.algorithms.stem import MOMENTUM_WEIGHTS, STEM
from rayfed.algorithms.storm import ESTIMATORS, MINIBATCHES
from rayfed.errors import ConfigError

# Keys of AlgorithmConfig that every algorithm takes; the others are per-algorithm.
COMMON_KEYS = ("name", "lr_local", "lr_global", "agg_weighting")
# Far above any useful value; a bound keeps a typo like 1e30 from overflowing the updates.
MAX_COEFFICIENT = 1e6
MAX_MEMORY_SIZE = 10**7
MAX_INIT_BATCH = 10**7
# The smallest normal float32: FedLALR's v_hat starts at eps^2 and must stay a normal number.
MIN_NORMAL_FLOAT32 = 1.1754943508222875e-38

_Decay = Annotated[float, Field(ge=0.0, lt=1.0)]
_Coefficient = Annotated[float, Field(ge=0.0, le=MAX_COEFFICIENT)]
_Positive = Annotated[float, Field(gt=0.0, le=MAX_COEFFICIENT)]

# What a set per-algorithm key admits, whichever algorithm takes it. AlgorithmConfig checks the
# type and finiteness; the ranges are here, beside the algorithms they come from.
HYPERPARAMETERS: dict[str, Any] = {
    "beta1": _Decay,
    "mu": _Coefficient,
    "beta2": _Decay,
    "memory_size": Annotated[int, Field(ge=0, le=MAX_MEMORY_SIZE)],
    "anchor_mode": Literal["last_local", "global"],
    "qp_scope": Literal["model", "tensor"],
    "qp_margin_local": _Coefficient,
    "qp_margin_global": _Coefficient,
    "eps": _Positive,
    "tau": _Positive,
    "eps_mode": Literal["init", "add"],
    "bias_correction": bool,
    "restart_momentum": bool,
    "vhat_agg": Literal["mean", "max"],
    "correction": Literal["joint", "local"],
    "trace_v_hat": bool,
    "a": Annotated[float, Field(ge=0.0, le=1.0)],
    "init_grad": Literal[INIT_GRADS],
    "init_batch": Annotated[int, Field(ge=1, le=MAX_INIT_BATCH)],
    "client_estimator": Literal[ESTIMATORS],
    "minibatches": Literal[MINIBATCHES],
    "server_momentum_skip_round0": bool,
    "momentum_weights": Literal[MOMENTUM_WEIGHTS],
    "alpha": Annotated[float, Field(gt=0.0, le=1.0)],
    "own_term": Literal[OWN_TERMS],
    "memory": bool,
    "client_replicas": bool,
}
_CHECKERS = {key: TypeAdapter(declared) for key, declared in HYPERPARAMETERS.items()}


@dataclass(frozen=True)
class AlgorithmEntry:
    build: Callable[..., Algorithm]
    defaults: dict[str, Any]                              # the algorithm's own config keys and their defaults
    fixed: dict[str, Any] = field(default_factory=dict)   # constructor arguments pinned by the name
    weighted: bool = True                                 # whether algorithm.agg_weighting applies
    server_lr: bool = True                                # whether algorithm.lr_global applies


# specs/fedlalr.md §5.5, CIFAR-10 column.
_FEDLALR = {"beta1": 0.9, "beta2": 0.995, "eps": 1e-8, "eps_mode": "init", "bias_correction": False}
_FEDADAM = {"beta1": 0.9, "beta2": 0.99, "tau": 0.01, "bias_correction": False}
_FEDAMS = {"beta1": 0.9, "beta2": 0.99, "bias_correction": False}

# specs/fedmos.md §7.4: the authors' run.sh values.
_FEDMOS = {"a": 0.1, "mu": 0.001, "beta1": 0.8, "init_grad": "full", "init_batch": None,
           "client_estimator": "storm_paper", "minibatches": "independent", "server_momentum_skip_round0": False}

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
    "fedlalr": AlgorithmEntry(FedLALR, {**_FEDLALR, "restart_momentum": False, "vhat_agg": "mean",
                                        "trace_v_hat": False}, server_lr=False),
    "local_amsgrad": AlgorithmEntry(FedLALR, _FEDLALR, {"synchronize_moments": False}, server_lr=False),
    "fedadam": AlgorithmEntry(FedOpt, _FEDADAM, {"server_optimizer": "adam"}),
    "fedyogi": AlgorithmEntry(FedOpt, _FEDADAM, {"server_optimizer": "yogi"}),
    "fedadagrad": AlgorithmEntry(FedOpt, {"beta1": 0.0, "tau": 0.01}, {"server_optimizer": "adagrad"}),
    "fedams_v1": AlgorithmEntry(FedOpt, {**_FEDAMS, "eps": 1e-4}, {"server_optimizer": "ams_v1"}),
    "fedams_v2": AlgorithmEntry(FedOpt, {**_FEDAMS, "eps": 1e-2}, {"server_optimizer": "ams_v2"}),
    "lafedopt": AlgorithmEntry(LaFedOPT, {"beta1": 0.8, "beta2": 0.999, "eps": 1e-4, "correction": "joint"}),
    "fedmos": AlgorithmEntry(FedMoS, _FEDMOS, server_lr=False),
    "stem": AlgorithmEntry(STEM, {"a": 0.1, "minibatches": "independent", "momentum_weights": "ucs"}, server_lr=False),
    # specs/fedcom.md §2: FedCOM is FedAvg with a server step gamma (lr_global) and a compressed upload;
    # FedPAQ is FedCOM with gamma = 1 as the FedPAQ paper runs it. The names are FedAvgM's, for reports.
    "fedcom": AlgorithmEntry(FedAvgM, {}, {"beta1": 0.0, "mu": 0.0}),
    "fedpaq": AlgorithmEntry(FedAvgM, {}, {"beta1": 0.0, "mu": 0.0}),
    # client_replicas None: Option I exactly when every client takes part (config.py fills it in).
    "fedgate": AlgorithmEntry(FedGATE, {"alpha": 1.0, "client_replicas": None}, {"own_term": "compressed", "memory": False},
                              weighted=False),
    "fedcomgate": AlgorithmEntry(FedGATE, {"alpha": 1.0, "own_term": "compressed", "memory": False,
                                           "client_replicas": None}, weighted=False),
    "scaffold": AlgorithmEntry(Scaffold, {}),
}
# What of train.* an algorithm's server step needs: FedMoS's normalisation eta_t I, FedGATE's eta_t.
_TRAIN_AWARE = {FedMoS: ("local_steps", "lr_decay"), FedGATE: ("lr_decay",)}


def resolve_hyperparameters(algorithm_config) -> None:
    """Fills the algorithm's defaults into unset keys, in place; a key set for an algorithm
    that does not take it is an error rather than silently ignored."""
    entry = ALGORITHMS[algorithm_config.name]
    if not entry.server_lr and algorithm_config.lr_global != 1.0:
        raise ConfigError(f"algorithm.lr_global does not apply to {algorithm_config.name}, which has no server "
                          f"learning rate")
    if not entry.weighted and algorithm_config.agg_weighting != "uniform":
        raise ConfigError(f"algorithm.agg_weighting={algorithm_config.agg_weighting} does not apply to "
                          f"{algorithm_config.name}, which averages the latest updates of all clients")
    for key, checker in _CHECKERS.items():
        value = getattr(algorithm_config, key)
        if key not in entry.defaults:
            if value is not None:
                common = [k for k in COMMON_KEYS[1:] if entry.server_lr or k != "lr_global"]
                takes = ", ".join(f"algorithm.{k}" for k in (*common, *entry.defaults))
                raise ConfigError(f"algorithm.{key} is not a parameter of {algorithm_config.name} (it takes {takes})")
        elif value is None:
            setattr(algorithm_config, key, entry.defaults[key])
        else:
            try:
                checker.validate_python(value)
            except ValidationError:
                raise ConfigError(f"algorithm.{key}={reprlib.repr(value)} must be "
                                  f"{allowed_values(HYPERPARAMETERS[key])}") from None
    if algorithm_config.eps_mode == "init" and algorithm_config.eps ** 2 < MIN_NORMAL_FLOAT32:
        raise ConfigError(f"algorithm.eps={algorithm_config.eps:g} is too small for eps_mode=init: v_hat starts at "
                          f"eps^2, which float32 cannot hold below {MIN_NORMAL_FLOAT32:.3g} (use eps >= 1.1e-19)")


def allowed_values(declared) -> str:
    """What a declared type admits, in words for a message: 'in [0, 1)', '> 0 and at most 1e6',
    'one of: model, tensor'."""
    if typing.get_origin(declared) is Literal:
        return "one of: " + ", ".join(map(str, typing.get_args(declared)))
    bounds = {name: getattr(constraint, name)
              for info in typing.get_args(declared)[1:] for constraint in getattr(info, "metadata", ())
              for name in ("gt", "ge", "lt", "le") if isinstance(constraint, getattr(annotated_types, name.title()))}
    if "lt" in bounds and ("gt" in bounds or "ge" in bounds):
        opening, lower = ("(", bounds["gt"]) if "gt" in bounds else ("[", bounds["ge"])
        return f"in {opening}{_number(lower)}, {_number(bounds['lt'])})"
    words = [f"{symbol} {_number(bounds[name])}" for name, symbol in (("gt", ">"), ("ge", ">=")) if name in bounds]
    if "le" in bounds:
        words.append(f"at most {_number(bounds['le'])}")
    return " and ".join(words)


def _number(value) -> str:
    """1e+06 as 1e6; integers in full, as they would be typed."""
    if isinstance(value, int):
        return str(value)
    mantissa, _, exponent = f"{value:g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def build_algorithm(algorithm_config, param_blocks: list[tuple[int, int]], train=None) -> Algorithm:
    """The configured algorithm; `train` (the config's train section) gives FedMoS the I and the
    decay of its server normalisation eta_t I, FedGATE its eta_t (without it: I = 1, no decay)."""
    entry = ALGORITHMS[algorithm_config.name]
    arguments = {key: getattr(algorithm_config, key) for key in entry.defaults}
    arguments.update(entry.fixed)
    if entry.weighted:
        arguments["agg_weighting"] = algorithm_config.agg_weighting
    if entry.build is GradMA:
        arguments["param_blocks"] = param_blocks
    if train is not None:
        train_values = {"local_steps": train.local_epochs or train.local_steps, "lr_decay": train.lr_decay}
        arguments.update({key: train_values[key] for key in _TRAIN_AWARE.get(entry.build, ())})
    return entry.build(lr_local=algorithm_config.lr_local, lr_global=algorithm_config.lr_global, **arguments)
