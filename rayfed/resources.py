"""What a run will need, known from its config alone, checked before anything starts: a model that
takes the dataset's inputs, memory this machine has, room for client states (in memory within
engine.state_memory_mb, else on the disk of engine.state_dir), and an availability model that can
keep up with the virtual clock. A run that would crash or be killed hours in stops here with one line."""
from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from rayfed.algorithms.local_training import LocalSchedule
from rayfed.algorithms.base import build_algorithm
from rayfed.data.base import resident_count, sample_count
from rayfed.errors import ConfigError, first_line
from rayfed.models import build_model
from rayfed.models.zoo import NotAModule
from rayfed.models.forward import structure_problem
from rayfed.registry import ALGORITHMS, DATASETS, MODELS, SELECTORS, Entry

FLOAT32_BYTES = 4
FLOAT64_BYTES = 8
LABEL_BYTES = 8
# Vectors of d floats each process keeps besides the algorithm's state: the model, its gradient,
# the broadcast and an update in flight.
MODEL_COPIES_PER_PROCESS = 4
# Where spilled client states go when engine.state_dir is unset, in the run directory.
DEFAULT_STATE_DIR = "client_states"
# MarkovOnline walks each client's on/off periods up to the current virtual time: a round that
# spans this many of them costs about as much as the round's training, and far more never ends.
MAX_MARKOV_PERIODS_PER_ROUND = 1000


@functools.lru_cache(maxsize=64)
def meta_model(name: str, dataset: str, hidden_sizes: tuple[int, ...]) -> torch.nn.Module:
    """The model for `dataset` on the meta device: shapes without storage, so that building even a
    billion-wide layer costs nothing. Raises what build_model raises for a model that does not fit."""
    shape = DATASETS.get(dataset)
    with torch.device("meta"):
        return build_model(name, shape.input_shape, shape.num_classes, list(hidden_sizes))


@functools.lru_cache(maxsize=64)
def input_misfit(name: str, dataset: str) -> str | None:
    """Why model `name` cannot take the dataset's inputs, or None: a forward pass of a zero batch of
    two. Whether the layers chain depends on the input shape, not on the hidden widths, so the
    model is built with the narrowest ones; its weights are left uninitialised (only shapes matter),
    and the pass runs on the CPU because on the meta device it would import torch._dynamo (seconds)."""
    shape = DATASETS.get(dataset)
    try:
        model = meta_model(name, dataset, (1,)).to_empty(device="cpu").eval()
        with torch.no_grad():
            model(torch.zeros(2, *shape.input_shape, dtype=shape.input_dtype))
    except NotAModule:
        raise
    except (ConfigError, RuntimeError, ValueError) as error:
        return first_line(error)[:200]
    return None


def check_model(config) -> torch.nn.Module:
    """The run's model on the meta device, once it is known to take the dataset's inputs and to
    train on the configured batches (augmented, with data.augment, which needs images)."""
    name, dataset = config.model.name, config.data.dataset
    if config.data.augment and len(DATASETS.get(dataset).input_shape) != 3:
        raise ConfigError(f"data.augment=true crops and flips images; data.dataset={dataset} has inputs of shape "
                          f"{DATASETS.get(dataset).input_shape}, not (channels, height, width); "
                          f"use data.augment=false")
    problem = input_misfit(name, dataset)
    if problem:
        fitting = [other for other in MODELS if not input_misfit(other, dataset)]
        raise ConfigError(f"model.name={name} does not fit data.dataset={dataset} "
                          f"({_inputs(DATASETS.get(dataset))}): {problem}; use one of: {', '.join(fitting)}")
    model = meta_model(name, dataset, tuple(config.model.hidden_sizes))
    needs = ALGORITHMS.get(config.algorithm.name).target.model_needs
    if needs and (problem := structure_problem(model, needs, name)):
        fitting = [other for other in MODELS if not input_misfit(other, dataset)
                   and not structure_problem(meta_model(other, dataset, (1,)), needs, other)]
        raise ConfigError(f"algorithm.name={config.algorithm.name} takes the model's {needs}: {problem}; "
                          f"use one of: {', '.join(fitting)}")
    if config.train.batch_size == 1 and has_batchnorm(model):
        raise ConfigError(f"train.batch_size=1: model.name={name} has BatchNorm, which cannot train on "
                          f"batches of one sample; use train.batch_size >= 2 or model.name=logreg")
    return model


def has_batchnorm(model: torch.nn.Module) -> bool:
    return any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm) for module in model.modules())


def _inputs(shape: Entry) -> str:
    if shape.input_dtype.is_floating_point:
        return f"inputs of shape {shape.input_shape}"
    return f"{str(shape.input_dtype).removeprefix('torch.')} token inputs of shape {shape.input_shape}"


def check_availability_walk(config, model: torch.nn.Module) -> None:
    """With markov availability, a round's virtual time (its slowest sampled client's, at the
    configured spreads) against the shorter mean on/off period."""
    systems, train = config.systems, config.train
    if systems.availability != "markov":
        return
    model_bytes = FLOAT32_BYTES * sum(parameter.numel() for parameter in model.parameters())
    # The run's longest rounds: the adaptive interval grows, and local epochs scale with a client's size.
    typical_samples = max(1, sample_count(config.data.dataset, config.data) // config.data.num_clients)
    steps = LocalSchedule.from_config(train).steps(train.rounds - 1, typical_samples)
    median_s = (steps * systems.step_time_s + model_bytes / systems.upload_bps
                + model_bytes / systems.download_bps)
    # The largest of S standard normals is about sqrt(2 ln S).
    tail = math.sqrt(2 * math.log(max(train.clients_per_round, 2)))
    round_s = median_s * math.exp(tail * max(systems.step_time_spread, systems.bandwidth_spread))
    if train.deadline_s is not None:
        round_s = min(round_s, train.deadline_s)
    round_s = max(round_s, systems.idle_wait_s)
    period_s = min(systems.mean_online_s, systems.mean_offline_s)
    if round_s / period_s > MAX_MARKOV_PERIODS_PER_ROUND:
        raise ConfigError(f"systems.availability=markov: a round of about {round_s:.3g} virtual seconds spans "
                          f"about {round_s / period_s:.3g} on/off periods of {period_s:g} s, more than the "
                          f"{MAX_MARKOV_PERIODS_PER_ROUND} a round may walk; raise systems.mean_online_s and "
                          f"systems.mean_offline_s, or lower systems.step_time_s or systems.idle_wait_s")


def estimate_memory(config, model: torch.nn.Module) -> dict[str, int]:
    """Bytes the run holds, by what holds them. On a Ray cluster the server and the workers may
    live on other machines, so only the driver's copy of the data counts against this one."""
    data = config.data
    shape = DATASETS.get(data.dataset)
    # An on-demand dataset holds its test set; its clients' samples exist only while they train.
    data_bytes = resident_count(data.dataset, data) * (math.prod(shape.input_shape) * shape.input_dtype.itemsize
                                                       + LABEL_BYTES)
    engine = config.engine
    if engine.backend == "ray" and (engine.address or os.environ.get("RAY_ADDRESS")):
        return {"data": data_bytes}
    params = [parameter.numel() for parameter in model.parameters()]
    vector_bytes = sum(params) * FLOAT32_BYTES
    # What the algorithm declares it holds (Algorithm.upload_size, memory_bytes), built without a model.
    algorithm = build_algorithm(config.algorithm)
    parts = {
        # The driver's copy, and on ray the object store's, which the workers read without copying.
        "data": data_bytes * (2 if engine.backend == "ray" else 1),
        "models": (engine.num_workers + 1) * (MODEL_COPIES_PER_PROCESS + algorithm.keeps_initial_model) * vector_bytes,
        "uploads": config.train.clients_per_round * FLOAT32_BYTES * algorithm.upload_size(sum(params)),
        "client states": 0,
        **algorithm.memory_bytes(sum(params), data.num_clients, len(params)),
    }
    parts["client states"] = client_state_size(config, model)[0]
    if SELECTORS.get(config.selection.selector).warmup:
        # Every client's full gradient on the server (float32 as sent, float64 to cluster), and the
        # N x N distances with their condensed copy.
        parts["cacs gradients"] = (data.num_clients * (vector_bytes + sum(params) * FLOAT64_BYTES)
                                   + 2 * data.num_clients ** 2 * FLOAT64_BYTES)
    return parts


def client_state_size(config, model: torch.nn.Module) -> tuple[int, int]:
    """(bytes, floats per client) of all N clients' states, as the algorithm declares them
    (Algorithm.client_state_floats)."""
    floats = build_algorithm(config.algorithm).client_state_floats(
        sum(parameter.numel() for parameter in model.parameters()),
        sum(buffer.numel() for buffer in model.buffers() if buffer.is_floating_point()))
    return config.data.num_clients * floats * FLOAT32_BYTES, floats


def state_budget(config, parts: dict[str, int]) -> int:
    """Bytes the client states may take in memory: engine.state_memory_mb, or what the machine's
    memory leaves after the run's other parts."""
    if config.engine.state_memory_mb is not None:
        return int(config.engine.state_memory_mb * 1e6)
    return physical_memory_bytes() - sum(size for part, size in parts.items() if part != "client states")


def plan_client_states(config, run_dir: Path) -> str | None:
    """Where the workers keep client states: in memory (None) when they fit the budget
    (state_budget), else spilled to the directory returned, engine.state_dir (default: the run
    directory's client_states/), which must be writable and whose disk must hold them (and, with
    checkpoints, the run directory's disk two copies more). Otherwise a ConfigError of one line
    naming the sizes and the keys that change them."""
    model = meta_model(config.model.name, config.data.dataset, tuple(config.model.hidden_sizes))
    size, floats = client_state_size(config, model)
    parts = {**estimate_memory(config, model), "client states": size}
    budget = state_budget(config, parts)
    if config.engine.state_dir:
        # A directory the user named is one they expect to work, whether or not this run spills.
        problem = _write_problem(Path(os.path.abspath(config.engine.state_dir)))
        if problem:
            raise ConfigError(f"engine.state_dir={config.engine.state_dir} cannot be written ({problem}); choose a "
                              f"writable directory")
    if size <= budget:
        return None
    directory = Path(os.path.abspath(config.engine.state_dir or run_dir / DEFAULT_STATE_DIR))
    where = (f"engine.state_dir={config.engine.state_dir}" if config.engine.state_dir else
             f"{directory} (engine.state_dir unset: the run directory's {DEFAULT_STATE_DIR}/)")
    allowed = (f"engine.state_memory_mb={config.engine.state_memory_mb:g}" if config.engine.state_memory_mb is not None
               else f"the {_gigabytes(max(budget, 0))} this machine's memory leaves for them (engine.state_memory_mb "
                    f"unset)")
    problem = _write_problem(directory)
    if problem:
        raise ConfigError(f"client states need {_size(size)}, more than {allowed}, and spill to {where}, "
                          f"which cannot be written ({problem}); choose a writable engine.state_dir")
    copies = 3 if config.train.checkpoint_every else 1
    needs: dict[int, list] = {}
    for path, share in ((directory, size), (Path(os.path.abspath(run_dir)), size * (copies - 1))):
        existing = _existing(path)
        needs.setdefault(existing.stat().st_dev, [0, existing])[0] += share
    for need, existing in needs.values():
        free = shutil.disk_usage(existing).free
        if need > free:
            checkpoints = " and two copies for train.checkpoint_every's checkpoints" if copies > 1 else ""
            raise ConfigError(f"client states need {_size(size)} ({config.data.num_clients} clients x {floats} "
                              f"floats of 4 bytes{checkpoints}), more than {allowed} and the {_gigabytes(free)} free "
                              f"on {existing}; raise engine.state_memory_mb, give engine.state_dir a disk with "
                              f"room, or lower data.num_clients")
    return str(directory)


def _existing(path: Path) -> Path:
    """`path`, or the nearest of its parents that exists."""
    return next(parent for parent in (path, *path.parents) if os.path.lexists(parent))


def _write_problem(directory: Path) -> str | None:
    """Why `directory` cannot be made or written in, or None: a file created (and removed) in it, or
    in the parent it would be made in, tells."""
    existing = _existing(directory)
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        descriptor, probe = tempfile.mkstemp(dir=existing, prefix=".rayfed-probe-")
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        return f"{existing}: {error.strerror or error}"
    return None


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# What lowers each part, for the message.
_REMEDIES = {
    "data": "lower data.num_clients or data.synthetic_max_samples",
    "models": "use a smaller model (model.name, model.hidden_sizes) or fewer engine.num_workers",
    "uploads": "use a smaller model or lower train.clients_per_round",
    "client states": "lower data.num_clients, use a smaller model, or an algorithm without client state",
    "server memory": "lower algorithm.memory_size or use a smaller model",
    "cacs gradients": "lower data.num_clients, use a smaller model, or selection.selector=acs",
}


def check_memory(config, model: torch.nn.Module) -> None:
    parts = estimate_memory(config, model)
    if parts.get("client states", 0) > state_budget(config, parts):
        # Spilled to disk, which plan_client_states checks once the run directory is known.
        del parts["client states"]
    needed, available = sum(parts.values()), physical_memory_bytes()
    if needed <= available:
        return
    largest = max(parts, key=parts.get)
    shares = ", ".join(f"{part} {_gigabytes(size)}" for part, size in parts.items() if size >= needed / 100)
    raise ConfigError(f"the run needs about {_gigabytes(needed)} ({shares}), more than this machine's "
                      f"{_gigabytes(available)}; {_REMEDIES[largest]}")


def _gigabytes(size: int) -> str:
    return f"{size / 1e9:.1f} GB"


def _size(size: int) -> str:
    return _gigabytes(size) if size >= 1e8 else f"{size / 1e6:.1f} MB"
