"""What a run will need, known from its config alone, checked before anything starts: a model that
takes the dataset's inputs, memory this machine has, and an availability model that can keep up
with the virtual clock. A run that would crash or be killed hours in stops here with one line."""
from __future__ import annotations

import functools
import math
import os
import torch

from rayfed.algorithms.local_training import LocalSchedule
from rayfed.algorithms.base import build_algorithm
from rayfed.data.base import resident_count, sample_count
from rayfed.errors import ConfigError, first_line
from rayfed.models import build_model
from rayfed.models.forward import structure_problem
from rayfed.registry import ALGORITHMS, DATASETS, MODELS, SELECTORS, Entry

FLOAT32_BYTES = 4
FLOAT64_BYTES = 8
LABEL_BYTES = 8
# Vectors of d floats each process keeps besides the algorithm's state: the model, its gradient,
# the broadcast and an update in flight.
MODEL_COPIES_PER_PROCESS = 4
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
    if config.train.batch_size == 1 and any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
                                            for module in model.modules()):
        raise ConfigError(f"train.batch_size=1: model.name={name} has BatchNorm, which cannot train on "
                          f"batches of one sample; use train.batch_size >= 2 or model.name=logreg")
    return model


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
    if SELECTORS.get(config.selection.selector).warmup:
        # Every client's full gradient on the server (float32 as sent, float64 to cluster), and the
        # N x N distances with their condensed copy.
        parts["cacs gradients"] = (data.num_clients * (vector_bytes + sum(params) * FLOAT64_BYTES)
                                   + 2 * data.num_clients ** 2 * FLOAT64_BYTES)
    return parts


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
    needed, available = sum(parts.values()), physical_memory_bytes()
    if needed <= available:
        return
    largest = max(parts, key=parts.get)
    shares = ", ".join(f"{part} {_gigabytes(size)}" for part, size in parts.items() if size >= needed / 100)
    raise ConfigError(f"the run needs about {_gigabytes(needed)} ({shares}), more than this machine's "
                      f"{_gigabytes(available)}; {_REMEDIES[largest]}")


def _gigabytes(size: int) -> str:
    return f"{size / 1e9:.1f} GB"
