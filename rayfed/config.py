"""Typed run configuration: dataclass defaults (the embedded quick-start), YAML files,
dotted `key=value` overrides, and validation that fails before any work starts."""
from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from rayfed.algorithms.registry import ALGORITHMS, resolve_hyperparameters
from rayfed.data.datasets import DATASETS, missing_files
from rayfed.data.partition import PARTITIONS
from rayfed.errors import ConfigError
from rayfed.systems.availability import AVAILABILITIES

MODELS = ("auto", "logreg", "mlp", "lenet5", "vgg11")
# The papers' model for each dataset: FedProx used logistic regression on Synthetic.
AUTO_MODELS = {"synthetic": "logreg", "mnist": "mlp", "fashion_mnist": "mlp", "cifar10": "lenet5", "cifar100": "vgg11",
               "cifar10_random": "lenet5"}
BACKENDS = ("local", "ray")
ROUND_POLICIES = ("sync", "deadline", "overcommit", "async_buffered")
STALENESS_WEIGHTS = ("none", "sqrt")
# Staleness weights scale uploads, which is only meaningful where an upload is a model update.
STALENESS_WEIGHTED_ALGORITHMS = ("fedavg", "fedavgm", "fedprox", "fedproxm")
AGG_WEIGHTINGS = ("uniform", "num_samples")


@dataclass
class DataConfig:
    dataset: str = "synthetic"
    root: str = "./data"
    download: bool = False
    num_clients: int = 100
    # "auto": the dataset's own client split for synthetic, dirichlet otherwise.
    partition: str = "auto"
    alpha: float = 0.1
    shards_per_client: int = 2
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    synthetic_max_samples: int = 1000


@dataclass
class ModelConfig:
    name: str = "auto"
    hidden_sizes: list[int] = field(default_factory=lambda: [200, 100])


@dataclass
class AlgorithmConfig:
    name: str = "fedavgm"
    lr_local: float = 0.02
    lr_global: float = 1.0
    # None: not set; the algorithm's default is filled in when the config is resolved.
    beta1: Optional[float] = None
    mu: Optional[float] = None
    beta2: Optional[float] = None
    memory_size: Optional[int] = None
    anchor_mode: Optional[str] = None
    qp_scope: Optional[str] = None
    qp_margin_local: Optional[float] = None
    qp_margin_global: Optional[float] = None
    agg_weighting: str = "uniform"


@dataclass
class TrainConfig:
    rounds: int = 1000
    clients_per_round: int = 10
    local_steps: int = 5
    batch_size: int = 64
    eval_every: int = 10
    round_policy: str = "sync"
    deadline_s: Optional[float] = None
    overcommit: float = 0.3
    concurrency: Optional[int] = None
    buffer_size: Optional[int] = None
    staleness_weight: str = "none"
    checkpoint_every: int = 0


@dataclass
class SystemsConfig:
    availability: str = "always"
    online_probability: float = 0.8
    online_concentration: float = 10.0
    mean_online_s: float = 600.0
    mean_offline_s: float = 600.0
    trace: Optional[str] = None
    step_time_s: float = 0.05
    step_time_spread: float = 0.0
    upload_bps: float = 1.0e6
    download_bps: float = 1.0e7
    bandwidth_spread: float = 0.0
    speed_trace: Optional[str] = None
    idle_wait_s: float = 60.0


@dataclass
class EngineConfig:
    backend: str = "ray"
    num_workers: int = 2
    worker_cpus: float = 1.0
    worker_gpus: float = 0.0
    server_gpus: float = 0.0
    address: Optional[str] = None
    round_timeout_s: Optional[float] = None
    worker_max_restarts: int = 3
    fault_injection: list[str] = field(default_factory=list)
    vectorize: bool = False


@dataclass
class Config:
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    systems: SystemsConfig = field(default_factory=SystemsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] = ()) -> Config:
    """The quick-start defaults, then the YAML file at `path`, then `key=value` overrides;
    typed, resolved and validated. Raises ConfigError on any bad input."""
    raw = Config().to_dict()
    if path is not None:
        _merge(raw, _read_yaml(Path(path)), prefix="")
    for override in overrides:
        key, value = _parse_override(override)
        _set_dotted(raw, key, value)
    config = _from_dict(Config, raw, prefix="")
    return resolve(config)


def resolve(config: Config) -> Config:
    """Validates `config` and fills in the choices left to rayfed ("auto", algorithm defaults).
    Returns a new Config; the one given is not changed."""
    config = _from_dict(Config, config.to_dict(), prefix="")
    _validate_ranges(config)
    if config.data.partition == "auto":
        config.data.partition = "natural" if config.data.dataset == "synthetic" else "dirichlet"
    if config.data.partition == "natural" and config.data.dataset != "synthetic":
        raise ConfigError("data.partition=natural is only available for data.dataset=synthetic; "
                          "use iid, dirichlet or shards")
    if config.engine.backend == "local":
        # The local engine is one in-process worker; recording another count would mislead.
        config.engine.num_workers = 1
    if config.model.name == "auto":
        config.model.name = AUTO_MODELS[config.data.dataset]
    resolve_hyperparameters(config.algorithm)
    memory_size = config.algorithm.memory_size
    if memory_size and memory_size < config.train.clients_per_round:
        raise ConfigError(f"algorithm.memory_size={memory_size} is below train.clients_per_round="
                          f"{config.train.clients_per_round}: the memory must hold every sampled client "
                          f"(use at least that, or 0 for no memory)")
    _check_dataset_files(config)
    return config


def _validate_ranges(config: Config) -> None:
    _choice("data.dataset", config.data.dataset, DATASETS)
    _choice("data.partition", config.data.partition, ("auto", *PARTITIONS))
    _choice("model.name", config.model.name, MODELS)
    _choice("engine.backend", config.engine.backend, BACKENDS)
    _choice("train.round_policy", config.train.round_policy, ROUND_POLICIES)
    _choice("systems.availability", config.systems.availability, AVAILABILITIES)
    _choice("train.staleness_weight", config.train.staleness_weight, STALENESS_WEIGHTS)
    _choice("algorithm.agg_weighting", config.algorithm.agg_weighting, AGG_WEIGHTINGS)
    _choice("algorithm.name", config.algorithm.name, tuple(ALGORITHMS))

    positive = {
        "data.num_clients": config.data.num_clients,
        "data.alpha": config.data.alpha,
        "data.shards_per_client": config.data.shards_per_client,
        "algorithm.lr_local": config.algorithm.lr_local,
        "algorithm.lr_global": config.algorithm.lr_global,
        "train.rounds": config.train.rounds,
        "train.clients_per_round": config.train.clients_per_round,
        "train.local_steps": config.train.local_steps,
        "train.batch_size": config.train.batch_size,
        "train.eval_every": config.train.eval_every,
        "engine.num_workers": config.engine.num_workers,
        "engine.worker_cpus": config.engine.worker_cpus,
        "systems.step_time_s": config.systems.step_time_s,
        "systems.upload_bps": config.systems.upload_bps,
        "systems.download_bps": config.systems.download_bps,
        "systems.idle_wait_s": config.systems.idle_wait_s,
    }
    for key, value in positive.items():
        if not value > 0:
            raise ConfigError(f"{key}={value} must be > 0")
    for key in ("step_time_spread", "bandwidth_spread"):
        if getattr(config.systems, key) < 0:
            raise ConfigError(f"systems.{key}={getattr(config.systems, key)} must be >= 0")
    if config.train.checkpoint_every < 0:
        raise ConfigError(f"train.checkpoint_every={config.train.checkpoint_every} must be >= 0 (0: never)")
    if config.train.overcommit < 0:
        raise ConfigError(f"train.overcommit={config.train.overcommit} must be >= 0")
    deadline = config.train.deadline_s
    if config.train.round_policy == "deadline" and (deadline is None or not deadline > 0):
        raise ConfigError(f"train.round_policy=deadline needs train.deadline_s > 0 (virtual seconds), got {deadline}")
    if deadline is not None and config.train.round_policy != "deadline":
        raise ConfigError(f"train.deadline_s is only used with train.round_policy=deadline, "
                          f"not {config.train.round_policy}")
    _resolve_async(config)
    _validate_faults(config)
    for key in ("synthetic_alpha", "synthetic_beta"):
        if getattr(config.data, key) < 0:
            raise ConfigError(f"data.{key}={getattr(config.data, key)} must be >= 0")
    if config.data.synthetic_max_samples < 2:
        raise ConfigError(f"data.synthetic_max_samples={config.data.synthetic_max_samples} must be >= 2 "
                          f"(a client needs a training and a test sample)")
    if any(size <= 0 for size in config.model.hidden_sizes):
        raise ConfigError(f"model.hidden_sizes={config.model.hidden_sizes} must all be > 0")
    if config.train.clients_per_round > config.data.num_clients:
        raise ConfigError(f"train.clients_per_round={config.train.clients_per_round} exceeds "
                          f"data.num_clients={config.data.num_clients}; it must be at most that")
    if config.engine.num_workers > config.data.num_clients:
        raise ConfigError(f"engine.num_workers={config.engine.num_workers} exceeds "
                          f"data.num_clients={config.data.num_clients}; a worker hosts at least one client")
    for key in ("worker_gpus", "server_gpus"):
        gpus = getattr(config.engine, key)
        if gpus < 0 or (gpus > 1 and gpus != int(gpus)):
            raise ConfigError(f"engine.{key}={gpus} must be >= 0, and a whole number when above 1")


def _validate_faults(config: Config) -> None:
    engine = config.engine
    if engine.round_timeout_s is not None and not engine.round_timeout_s > 0:
        raise ConfigError(f"engine.round_timeout_s={engine.round_timeout_s} must be > 0 (wall-clock seconds)")
    if engine.worker_max_restarts < 0:
        raise ConfigError(f"engine.worker_max_restarts={engine.worker_max_restarts} must be >= 0")
    if (engine.round_timeout_s is not None or engine.fault_injection) and engine.backend != "ray":
        raise ConfigError("engine.round_timeout_s and engine.fault_injection need engine.backend=ray")
    for entry in engine.fault_injection:
        parse_fault(entry, engine.num_workers)


def parse_fault(entry: str, num_workers: int) -> tuple[str, int, int, float]:
    """'kill:WORKER:ROUND' or 'delay:WORKER:ROUND:SECONDS' (ROUND 1-based, as in metrics.jsonl)."""
    parts = entry.split(":")
    try:
        kind, worker, round_number = parts[0], int(parts[1]), int(parts[2])
        seconds = float(parts[3]) if kind == "delay" else 0.0
        well_formed = (kind == "kill" and len(parts) == 3) or (kind == "delay" and len(parts) == 4 and seconds > 0)
    except (IndexError, ValueError):
        well_formed = False
    if not well_formed or not 0 <= worker < num_workers or round_number < 1:
        raise ConfigError(f"engine.fault_injection entry {entry!r} must be kill:WORKER:ROUND or "
                          f"delay:WORKER:ROUND:SECONDS, with 0 <= WORKER < engine.num_workers={num_workers} "
                          f"and ROUND >= 1")
    return kind, worker, round_number, seconds


def _resolve_async(config: Config) -> None:
    train = config.train
    if train.round_policy != "async_buffered":
        for key in ("concurrency", "buffer_size"):
            if getattr(train, key) is not None:
                raise ConfigError(f"train.{key} is only used with train.round_policy=async_buffered")
        if train.staleness_weight != "none":
            raise ConfigError("train.staleness_weight is only used with train.round_policy=async_buffered")
        return
    if train.buffer_size is None:
        train.buffer_size = train.clients_per_round
    if train.concurrency is None:
        train.concurrency = train.buffer_size
    if not 1 <= train.buffer_size <= train.concurrency <= config.data.num_clients:
        raise ConfigError(f"train.round_policy=async_buffered needs 1 <= train.buffer_size ({train.buffer_size}) "
                          f"<= train.concurrency ({train.concurrency}) <= data.num_clients "
                          f"({config.data.num_clients})")
    if train.staleness_weight != "none" and config.algorithm.name not in STALENESS_WEIGHTED_ALGORITHMS:
        raise ConfigError(f"train.staleness_weight={train.staleness_weight} scales model updates; "
                          f"{config.algorithm.name} uploads something else (use it with "
                          f"{', '.join(STALENESS_WEIGHTED_ALGORITHMS)})")


def _check_dataset_files(config: Config) -> None:
    if config.data.download or config.data.dataset == "synthetic":
        return
    missing = missing_files(config.data.dataset, config.data.root)
    if missing:
        folder = missing[0].parent
        names = ", ".join(path.name for path in missing)
        raise ConfigError(f"{config.data.dataset} files missing under {folder}: {names} "
                          f"(put the official files there, or set data.download=true)")


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(allowed)}{_did_you_mean(value, allowed)}")


def _did_you_mean(word: str, candidates) -> str:
    close = difflib.get_close_matches(str(word), list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: "
                          f"{getattr(error, 'problem', None) or error}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not a {type(loaded).__name__}")
    return loaded


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like key=value, e.g. train.rounds=10")
    try:
        return key.strip(), yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"override {text!r}: cannot parse the value {value!r}") from None


def _merge(target: dict, source: dict, prefix: str) -> None:
    for key, value in source.items():
        dotted = f"{prefix}{key}"
        if key not in target:
            raise ConfigError(f"unknown key {dotted!r}{_did_you_mean_key(dotted)}")
        if isinstance(target[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{dotted} must be a mapping of keys ({', '.join(target[key])})")
            _merge(target[key], value, prefix=f"{dotted}.")
        else:
            target[key] = value


def _set_dotted(raw: dict, dotted: str, value: Any) -> None:
    node = raw
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"unknown key {dotted!r}{_did_you_mean_key(dotted)}")
        if depth == len(parts) - 1:
            if isinstance(node[part], dict):
                raise ConfigError(f"{dotted} is a section; set one of its keys, e.g. "
                                  f"{dotted}.{next(iter(node[part]))}=...")
            node[part] = value
        else:
            node = node[part]


def all_keys() -> list[str]:
    keys = []

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                keys.append(f"{prefix}{key}")
    walk(Config().to_dict(), "")
    return keys


def _did_you_mean_key(dotted: str) -> str:
    """Prefers a key of the same section that the typed leaf begins (lr -> lr_local), then
    the closest spelling, then the same leaf in another section (rounds -> train.rounds)."""
    keys = all_keys()
    section, _, leaf = dotted.rpartition(".")
    same_section = [k for k in keys if k.rpartition(".")[0] == section]
    close = [k for k in same_section if k.rpartition(".")[2].startswith(leaf)]
    close = close or difflib.get_close_matches(dotted, keys, n=1, cutoff=0.6)
    close = close or [k for k in keys if k.rpartition(".")[2] == leaf]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _from_dict(cls, raw: dict, prefix: str):
    hints = typing.get_type_hints(cls)
    values = {}
    for spec in dataclasses.fields(cls):
        dotted = f"{prefix}{spec.name}"
        hint = hints[spec.name]
        value = raw[spec.name]
        if dataclasses.is_dataclass(hint):
            values[spec.name] = _from_dict(hint, value, prefix=f"{dotted}.")
        else:
            values[spec.name] = _coerce(dotted, value, hint)
    return cls(**values)


def _coerce(key: str, value: Any, hint) -> Any:
    """Checks `value` against the annotated type; ints are accepted where floats are expected."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if value is None:
            return None
        return _coerce(key, value, options[0])
    if origin is list:
        (item_type,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list of {item_type.__name__}, got {value!r}")
        return [_coerce(f"{key}[{index}]", item, item_type) for index, item in enumerate(value)]
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):
        # YAML 1.1 reads 1e9 (no dot) as a string; researchers write it that way.
        try:
            return float(value)
        except ValueError:
            pass
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint in (bool, str) and isinstance(value, hint):
        return value
    raise ConfigError(f"{key} must be {_type_name(hint)}, got {value!r} ({type(value).__name__})")


def _type_name(hint) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))
