"""The local engine and the ray engine with any number of workers give bitwise-identical runs."""
import json

import pytest
import torch

import rayfed
from rayfed.metrics import WALL_CLOCK_KEYS

SYNTHETIC_MLP = ["data.num_clients=30", "train.clients_per_round=7", "train.rounds=4", "train.local_steps=3",
                 "train.batch_size=16", "train.eval_every=2", "model.name=mlp", "model.hidden_sizes=[16]",
                 "data.partition=dirichlet", "data.alpha=0.5", "algorithm.name=fedavgm"]
# The ray engine as the suite runs it: a run builds the actors that the previous run in its process kept
# (engine.reuse_actors) instead of starting processes, most of a small ray run's time. The bitwise checks then
# also hold a reused actor to a fresh one's bits.
ON_RAY = ["engine.backend=ray", "engine.reuse_actors=true"]


def run(tmp_path, overrides, name):
    config = rayfed.load_config(None, overrides)
    return rayfed.run(config, run_dir=tmp_path / name, progress=False)


def without_wall_clock(history):
    """The history as JSON text, wall-clock keys dropped: NaN diagnostics then compare equal."""
    return json.dumps([{k: v for k, v in metrics.items() if k not in WALL_CLOCK_KEYS} for metrics in history])


def assert_same_run(reference, other):
    assert torch.equal(reference.params, other.params)
    assert torch.equal(reference.buffers, other.buffers)
    assert without_wall_clock(reference.history) == without_wall_clock(other.history)


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["synthetic_mlp", "cifar_lenet"])
def test_local_and_ray_with_1_2_3_workers_are_bitwise_identical(tmp_path, ray_cluster, workload, request):
    overrides = SYNTHETIC_MLP if workload == "synthetic_mlp" else request.getfixturevalue("cifar_lenet")
    reference = run(tmp_path, overrides + ["engine.backend=local"], "local")
    assert reference.buffers.numel() > 0         # BatchNorm statistics travel and are compared too
    assert len(reference.history) == int(next(o for o in overrides if o.startswith("train.rounds="))[13:])
    for workers in (1, 2, 3):
        other = run(tmp_path, overrides + [*ON_RAY, f"engine.num_workers={workers}"], f"ray{workers}")
        assert_same_run(reference, other)


def test_same_seed_same_bits_and_different_seed_different_run(tmp_path):
    overrides = SYNTHETIC_MLP + ["engine.backend=local"]
    first = run(tmp_path, overrides + ["seed=1"], "a")
    again = run(tmp_path, overrides + ["seed=1"], "b")
    other = run(tmp_path, overrides + ["seed=2"], "c")
    assert_same_run(first, again)
    assert not torch.equal(first.params, other.params)
    assert first.history[0]["train_loss"] != other.history[0]["train_loss"]


@pytest.mark.slow
def test_ray_engine_refuses_resources_the_cluster_lacks(tmp_path, ray_cluster):
    """A GPU request on a GPU-less cluster fails at once, rather than waiting forever for placement."""
    config = rayfed.load_config(None, SYNTHETIC_MLP + [*ON_RAY, "engine.num_workers=2",
                                                       "engine.worker_gpus=0.25"])
    with pytest.raises(rayfed.ConfigError, match=r"engine.worker_gpus needs 0.5 GPUs but "
                                                 r"the Ray cluster has 0"):
        rayfed.run(config, run_dir=tmp_path / "gpu", progress=False)
    assert not (tmp_path / "gpu").exists()
    # A server that reserves GPUs counts; unset, it shares the workers' GPU and reserves none.
    reserving = rayfed.load_config(None, SYNTHETIC_MLP + [*ON_RAY, "engine.num_workers=2",
                                                          "engine.worker_gpus=0.25", "engine.server_gpus=0.5"])
    with pytest.raises(rayfed.ConfigError, match=r"engine.worker_gpus \+ engine.server_gpus needs 1 GPUs but "
                                                 r"the Ray cluster has 0"):
        rayfed.run(reserving, run_dir=tmp_path / "gpu", progress=False)


def test_ray_engine_refuses_workers_that_fit_the_clusters_cpus_but_none_of_its_nodes(monkeypatch):
    """Two live nodes of 2 CPUs (and a dead one of 8): Ray would wait forever for a node for a 3-CPU worker."""
    import ray

    from rayfed.engine.ray import _check_resources
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}] * 2 +
                        [{"Alive": False, "Resources": {"CPU": 8.0}}])

    def check(*overrides):
        _check_resources(rayfed.load_config(None, SYNTHETIC_MLP + [*ON_RAY, *overrides]))

    check("engine.num_workers=2", "engine.worker_cpus=2")
    check("engine.num_workers=4", "engine.worker_cpus=1")
    refusal = r"^engine.num_workers=1 workers of 3 CPUs \(engine.worker_cpus\) do not fit on the Ray cluster's nodes: " \
              r"they hold 0 \(CPUs a node: 2, 2\)$"
    with pytest.raises(rayfed.ConfigError, match=refusal):
        check("engine.num_workers=1", "engine.worker_cpus=3")
    with pytest.raises(rayfed.ConfigError, match="^engine.num_workers=3 workers of 1.25 CPUs .* they hold 2 "):
        check("engine.num_workers=3", "engine.worker_cpus=1.25")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [
    ["algorithm.name=fedlalr", "algorithm.lr_local=0.002", "train.lr_decay=0.95", "train.weight_decay=0.001",
     "train.max_grad_norm=5", "train.interval=adaptive", "train.interval_unit=steps"],
    ["algorithm.name=fedadam", "algorithm.lr_global=0.1", "selection.selector=acs"],
    ["algorithm.name=fedmos", "algorithm.lr_local=0.05", "selection.selector=cacs", "selection.cacs_warmup_rounds=2",
     "selection.cacs_clusters=4"],
])
def test_adaptive_algorithms_are_bitwise_identical_across_engines_and_worker_counts(tmp_path, ray_cluster, algorithm):
    """Stateless clients are dealt to other workers as the worker count changes (specs/fedlalr.md C16, C17);
    a selector's draws and weights are the server's alone. One process's training is the local engine's; one ray
    worker's is test_local_and_ray_with_1_2_3_workers_are_bitwise_identical's."""
    overrides = SYNTHETIC_MLP + algorithm
    reference = run(tmp_path, overrides + ["engine.backend=local"], "local")
    for workers in (2, 3):
        other = run(tmp_path, overrides + [*ON_RAY, f"engine.num_workers={workers}"], f"ray{workers}")
        assert_same_run(reference, other)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [
    ["algorithm.name=mifa"],
    ["algorithm.name=mifam"],
    ["algorithm.name=gradma_w"],
    ["algorithm.name=gradma_s", "algorithm.memory_size=10"],          # 30 clients through 10 rows: evictions
    ["algorithm.name=gradma", "algorithm.memory_size=10", "algorithm.qp_scope=tensor"],
    ["algorithm.name=scaffold"],
    ["algorithm.name=fedcomgate", "compression.name=top_k", "compression.ratio=0.2", "algorithm.memory=true"],
    ["algorithm.name=fedcomgate", "compression.name=qsgd", "compression.per_tensor=true"],
])
def test_client_state_and_memory_algorithms_are_bitwise_identical_across_engines(tmp_path, ray_cluster, algorithm):
    """Client state (MIFA's latest updates, GradMA's last local models) stays with the worker that owns
    the client, and the server's memory and QPs are deterministic: any worker count gives the same bits."""
    overrides = SYNTHETIC_MLP + ["train.rounds=6", "train.eval_every=3"] + algorithm
    reference = run(tmp_path, overrides + ["engine.backend=local"], "local")
    other = run(tmp_path, overrides + [*ON_RAY, "engine.num_workers=3"], "ray3")
    assert_same_run(reference, other)
    assert reference.summary["client_state_bytes"] == other.summary["client_state_bytes"]
    if "gradma_s" not in algorithm[0]:
        assert reference.summary["client_state_bytes"] > 0
    if "memory_size" in " ".join(algorithm):
        assert max(m["memory_evictions"] for m in reference.history) > 0
