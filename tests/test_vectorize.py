"""engine.vectorize: a worker's clients trained as one batch equal sequential training, within
the documented tolerance; where the algorithm or model cannot be batched, the run says so and
trains sequentially."""
import pytest
import torch

from rayfed.engine.worker import assign_to_workers
from tests.test_engine_equivalence import ON_RAY, assert_same_run, run

# 50-64 samples per client, batches of 32: the second step's batches differ in size between
# clients, so the padding of the batched minibatches is exercised.
SMALL = ["engine.backend=local", "data.num_clients=40", "train.clients_per_round=9", "train.rounds=4",
         "train.local_steps=3", "train.batch_size=32", "data.synthetic_max_samples=64", "model.name=logreg",
         "train.eval_every=2", "algorithm.lr_local=0.05"]
# The tolerance docs/concepts/performance.md documents for engine.vectorize.
RTOL, ATOL = 1e-5, 1e-6


@pytest.mark.parametrize("algorithm", ["fedavg", "fedavgm", "fedprox", "fedproxm", "gradma_s", "fedlalr",
                                       "local_amsgrad", "fedadam", "fedams_v1", "lafedopt", "fedmos", "stem"])
def test_vectorized_clients_match_sequential_training(tmp_path, algorithm):
    overrides = SMALL + [f"algorithm.name={algorithm}"] + (["algorithm.mu=0.1"] if "prox" in algorithm else [])
    if algorithm in ("fedlalr", "local_amsgrad", "lafedopt"):
        # the adaptive local steps with every per-client option of train.* on
        overrides += ["algorithm.lr_local=0.002", "algorithm.eps=0.001", "train.max_grad_norm=1",
                      "train.weight_decay=0.01", "train.weight_decay_mode=decoupled", "train.lr_decay=0.9"]
    sequential = run(tmp_path, overrides, "sequential")
    vectorized = run(tmp_path, overrides + ["engine.vectorize=true"], "vectorized")
    assert vectorized.summary["vectorized"] and not sequential.summary["vectorized"]
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=RTOL, atol=ATOL)
    for seq_round, vec_round in zip(sequential.history, vectorized.history):
        assert vec_round["train_loss"] == pytest.approx(seq_round["train_loss"], rel=RTOL)


def test_vectorized_ray_workers_match_the_local_engine(tmp_path, ray_cluster):
    local = run(tmp_path, SMALL + ["engine.vectorize=true"], "local")
    ray_run = run(tmp_path, [*SMALL, *ON_RAY, "engine.num_workers=2", "engine.vectorize=true"], "ray")
    assert ray_run.summary["vectorized"]
    torch.testing.assert_close(ray_run.params, local.params, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("overrides, reason", [
    (["model.name=mlp", "model.hidden_sizes=[8]"], "BatchNorm1d layers"),
    (["algorithm.name=mifa"], "algorithm mifa has no batched local step"),
    (["train.local_epochs=1", "train.batch_size=16"], "local epochs give this partition's clients different numbers"),
    (["compression.name=qsgd"], "compressed uploads are encoded client by client"),
])
def test_unbatchable_runs_say_why_and_train_sequentially(tmp_path, capsys, overrides, reason):
    fallback = run(tmp_path, SMALL + overrides + ["engine.vectorize=true"], "fallback")
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1 and reason in message[0] and "training clients one after another" in message[0]
    assert not fallback.summary["vectorized"]
    assert_same_run(run(tmp_path, SMALL + overrides, "sequential"), fallback)


def test_stateless_clients_are_dealt_out_evenly_and_stateful_ones_stay_home():
    clients = [3, 5, 7, 9, 11, 13, 2]
    even = assign_to_workers(clients, 2, clients_keep_state=False)
    assert sorted(c for ids in even.values() for c in ids) == sorted(clients)
    assert sorted(len(ids) for ids in even.values()) == [3, 4]
    assert assign_to_workers(clients, 2, clients_keep_state=True) == {0: [2], 1: [3, 5, 7, 9, 11, 13]}
