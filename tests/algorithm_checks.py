"""The checks every algorithm's own tests run on it through whole runs: the local engine and the
ray engine with 3 workers give the same bits (3 split the 7 clients of a round unevenly; that any
worker count gives the engine's same bits is test_engine_equivalence's); a run interrupted and resumed from its
checkpoint ends where the whole run ends; the memory check counts the client state it declares.
A real ClientTask for objectives that need a model (MOON, FedMLB) is built here too."""
import copy
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import rayfed
from rayfed.algorithms.local_training import TrainingTask
from rayfed.engine.worker import ClientTask
from rayfed.models import FlatModel, build_model
from rayfed.resources import plan_client_states
from tests.test_checkpoint import ROUNDS, interrupted
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run

SMALL = ["engine.backend=local", "data.num_clients=12", "train.clients_per_round=4", "train.rounds=4",
         "train.eval_every=2", "train.local_steps=3", "model.name=mlp", "model.hidden_sizes=[8, 6]"]


def run(tmp_path, overrides, name):
    return rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / name, progress=False)


def assert_same_params(tmp_path, first, second):
    """Two small local runs end with the same model, bit for bit."""
    a, b = run(tmp_path, SMALL + first, "first"), run(tmp_path, SMALL + second, "second")
    assert torch.equal(a.params, b.params) and torch.equal(a.buffers, b.buffers)
    return a


def assert_engines_agree(tmp_path, overrides):
    reference = run(tmp_path, SYNTHETIC_MLP + overrides + ["engine.backend=local"], "local")
    other = run(tmp_path, SYNTHETIC_MLP + overrides + [*ON_RAY, "engine.num_workers=3"], "ray3")
    assert_same_run(reference, other)
    return reference


def assert_resume_agrees(tmp_path, monkeypatch, overrides):
    overrides = SYNTHETIC_MLP + ROUNDS + ["engine.backend=local"] + overrides
    whole = run(tmp_path, overrides, "whole")
    resumed = rayfed.resume(interrupted(tmp_path, overrides, monkeypatch), progress=False)
    assert_same_run(whole, resumed)
    return whole


def assert_memory_check_counts_client_state(monkeypatch, overrides):
    """N x d client floats beyond a 1 GB machine's memory would spill to disk; with 0.1 GB of disk
    free they are refused before any work, with the estimate. FedAvg's same run keeps nothing."""
    monkeypatch.setattr("rayfed.resources.physical_memory_bytes", lambda: 10**9)
    monkeypatch.setattr("rayfed.resources.shutil.disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 0, 10**8))
    base = ["data.num_clients=2000", "data.synthetic_max_samples=50", "model.name=mlp", "model.hidden_sizes=[2000]",
            "engine.backend=local"]
    run_dir = Path(tempfile.gettempdir()) / "never-made"
    assert plan_client_states(rayfed.load_config(None, base + ["algorithm.name=fedavg"]), run_dir) is None
    config = rayfed.load_config(None, base + overrides)
    with pytest.raises(rayfed.ConfigError, match=r"^client states need 1\.2 GB \(2000 clients x \d+ floats of 4 "
                                                 r"bytes\), more than the 1\.0 GB this machine's memory leaves for "
                                                 r"them \(engine.state_memory_mb unset\) and the 0\.1 GB free on "):
        plan_client_states(config, run_dir)


def model_task(module, seed=0, num_samples=20, batch_size=8, steps=3, num_classes=3):
    """The worker's ClientTask for `module` (float64) on random inputs, and a copy of its batch
    stream: (task, batches) where batches is a fresh task with the same seed, for references."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_samples, 6, generator=generator, dtype=torch.float64)
    targets = torch.randint(num_classes, (num_samples,), generator=generator)

    def task(model):
        return ClientTask(FlatModel(model), inputs, targets, torch.arange(num_samples), batch_size,
                          torch.Generator().manual_seed(seed + 1))
    return TrainingTask(task(module), steps), task(copy.deepcopy(module))


def flat(module, buffers=False):
    """A module's parameters (or floating-point buffers) as one vector, as FlatModel lays them out."""
    tensors = [b for b in module.buffers() if b.is_floating_point()] if buffers else list(module.parameters())
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def tiny_mlp(seed=0):
    """rayfed's mlp with BatchNorm, 6 inputs, hidden [5, 4], 3 classes, in float64: three blocks."""
    torch.manual_seed(seed)
    return build_model("mlp", (6,), 3, hidden_sizes=[5, 4]).double()


def perturbed(module, scale, seed):
    """A copy of `module` with every parameter and running statistic moved by noise."""
    other = copy.deepcopy(module)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*other.parameters(), *(b for b in other.buffers() if b.is_floating_point())]:
            tensor.add_(scale * torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype))
    return other
