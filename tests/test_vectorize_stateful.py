"""engine.vectorize for algorithms whose clients keep state (FedDyn, MIFA, MIFAM, FedGATE, FedCOMGATE) or take
a full local gradient (MimeLite): each client of a stack trains from its own state and keeps the state it
trained into, so over rounds in which clients come back, vectorised runs equal sequential ones within the
documented tolerance, client by client."""
import json
from collections import Counter

import pytest
import torch

from tests.test_engine_equivalence import ON_RAY, assert_same_run
from tests.test_vectorize import ATOL, RTOL, SMALL, run

# 12 clients, 6 a round, 4 rounds: 24 participations of 12 clients, so some clients train again from their state.
RETURNING = SMALL + ["data.num_clients=12", "train.clients_per_round=6", "train.rounds=4",
                     "logging.client_metrics=true"]
EVERY_OPTION = ["train.lr_decay=0.9", "train.max_grad_norm=1", "train.weight_decay=0.01"]


def client_rows(result):
    return [json.loads(line) for line in (result.run_dir / "clients.jsonl").read_text().splitlines()]


def assert_close_runs(vectorized, sequential):
    """The model, every round's record and every client's row within the documented tolerance."""
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=RTOL, atol=ATOL)
    assert len(vectorized.history) == len(sequential.history)
    for vec_round, seq_round in zip(vectorized.history, sequential.history):
        assert vec_round.keys() == seq_round.keys()
        assert vec_round["train_loss"] == pytest.approx(seq_round["train_loss"], rel=RTOL)
        for key in ("tracking_max_norm", "client_message_bits_mean", "compression_error", "bits_up"):
            assert vec_round.get(key) == pytest.approx(seq_round.get(key), rel=1e-4)
    vec_rows, seq_rows = client_rows(vectorized), client_rows(sequential)
    assert [(row["round"], row["client"]) for row in vec_rows] == [(row["round"], row["client"]) for row in seq_rows]
    for vec_row, seq_row in zip(vec_rows, seq_rows):
        assert vec_row.keys() == seq_row.keys()
        assert vec_row["train_loss"] == pytest.approx(seq_row["train_loss"], rel=RTOL)
        assert vec_row["local_steps"] == seq_row["local_steps"]


@pytest.mark.parametrize("overrides", [
    ["algorithm.name=feddyn", *EVERY_OPTION],
    ["algorithm.name=feddyn", "algorithm.alpha=0.1"],
    ["algorithm.name=mifa"],
    ["algorithm.name=mifam", "train.weight_decay=0.01", "train.weight_decay_mode=decoupled"],
    ["algorithm.name=fedgate", *EVERY_OPTION],
    ["algorithm.name=fedcomgate"],
    ["algorithm.name=fedcomgate", "compression.name=qsgd", "algorithm.alpha=0.5", "compression.downlink=true"],
    ["algorithm.name=fedcomgate", "compression.name=top_k", "algorithm.memory=true", "train.lr_decay=0.9"],
    ["algorithm.name=mimelite", *EVERY_OPTION],
    ["algorithm.name=mimelite", "algorithm.agg_weighting=num_samples", "algorithm.lr_global=0.8"],
    # BatchNorm, where the batched kernels round otherwise: clients of one size (iid).
    ["algorithm.name=mimelite", "model.name=mlp", "model.hidden_sizes=[8]", "data.partition=iid",
     "data.synthetic_max_samples=48"],
])
def test_vectorized_stateful_clients_match_sequential_training(tmp_path, overrides):
    sequential = run(tmp_path, RETURNING + overrides, "sequential")
    vectorized = run(tmp_path, RETURNING + overrides + ["engine.vectorize=true"], "vectorized")
    assert vectorized.summary["vectorized"] and not sequential.summary["vectorized"]
    assert max(Counter(row["client"] for row in client_rows(vectorized)).values()) >= 2
    assert_close_runs(vectorized, sequential)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavg", "mifa", "moon"])
def test_vectorized_runs_are_bitwise_the_same_for_any_number_of_workers(tmp_path, ray_cluster, algorithm):
    """A client's state and its row of the batched computation do not depend on which clients share its
    batch: a BatchNorm MLP on clients of different sizes (padded minibatches), on the local engine (one
    worker) and with 2 and 3 Ray workers."""
    overrides = RETURNING + [f"algorithm.name={algorithm}", "engine.vectorize=true", "model.name=mlp",
                             "model.hidden_sizes=[16]", "train.batch_size=48"]
    reference = run(tmp_path, overrides, "local")
    assert reference.summary["vectorized"]
    for workers in (2, 3):
        assert_same_run(reference, run(tmp_path, overrides + [*ON_RAY, f"engine.num_workers={workers}"], f"w{workers}"))


@pytest.mark.slow
def test_vectorized_fedgate_on_ray_workers_matches_the_local_engine(tmp_path, ray_cluster):
    """The replies reach each worker's stacked clients as they reach the local engine's."""
    overrides = RETURNING + ["algorithm.name=fedgate", "engine.vectorize=true"]
    local = run(tmp_path, overrides, "local")
    ray_run = run(tmp_path, [*overrides, *ON_RAY, "engine.num_workers=2"], "ray")
    assert ray_run.summary["vectorized"]
    assert_close_runs(ray_run, local)
