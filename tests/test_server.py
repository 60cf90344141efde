"""The Server's sampling, traffic accounting, BatchNorm buffer averaging and evaluation schedule."""
import dataclasses

import numpy as np
import torch

from rayfed.algorithms.base import Upload
from rayfed.preflight import load_config
from rayfed.data import load_dataset
from rayfed.engine.messages import ClientResult, WorkerResult
from rayfed.engine.server import Server
from rayfed.systems.clients import make_client_systems

OVERRIDES = ["engine.backend=local", "data.num_clients=20", "train.clients_per_round=5", "train.rounds=7",
             "train.eval_every=3", "model.name=mlp", "model.hidden_sizes=[4]"]


def make_server(*extra):
    config = load_config(None, OVERRIDES + list(extra))
    dataset = load_dataset("synthetic", num_clients=20)
    client_systems = dataclasses.replace(make_client_systems(config), client_sizes=np.full(20, 50))
    return config, Server(config, (dataset.test_x, dataset.test_y), dataset.input_shape, dataset.num_classes,
                          client_systems)


def fake_results(server, sampled, buffers_of):
    """What the workers would send: each client's model change is minus its id (a descent of its id),
    its buffers `buffers_of(id)`."""
    d, b = server.model.num_params, server.buffers.numel()
    results = [ClientResult(cid, Upload({"model_change": torch.full((d,), -float(cid))}, num_samples=cid + 1,
                                        metrics={"train_loss": float(cid), "local_steps": 5}), buffers_of(cid, b))
               for cid in sampled]
    return WorkerResult.pack(results)


def step_with_zero_uploads(server, round, plan):
    """The server's step on `plan` with every participant's upload zero (no worker results when nobody took part)."""
    participants = plan.participants
    return server.step(round, plan, *([fake_results(server, participants, lambda c, b: torch.zeros(b))]
                                      if participants else []))


def test_sampling_draws_distinct_clients_uniformly_and_reproducibly():
    _, server = make_server()
    counts = np.zeros(20)
    for round in range(4000):
        sampled = server.sample(round).participants
        assert len(set(sampled)) == 5
        counts[sampled] += 1
    assert np.allclose(counts / 4000, 5 / 20, atol=0.03)       # spec §7 check 30: P(i in S_t) = S/N
    _, again = make_server()
    assert again.sample(17).participants == server.sample(17).participants
    _, other_seed = make_server("seed=1")
    assert [other_seed.sample(r).participants for r in range(5)] != [server.sample(r).participants for r in range(5)]


def test_traffic_buffers_and_evaluation_schedule():
    config, server = make_server()
    bytes_per_model = 4 * (server.model.num_params + server.buffers.numel())
    evaluated = []
    for round in range(config.train.rounds):
        plan = server.sample(round)
        sampled = plan.participants
        metrics, _ = server.step(round, plan, fake_results(server, sampled, lambda cid, b: torch.full((b,), float(cid))))
        # spec §7 check 31: bytes per round = S x (down + up), float32 model and buffers each way
        assert metrics["bytes_down"] == metrics["bytes_up"] == 5 * bytes_per_model
        assert metrics["num_participants"] == 5
        assert metrics["train_loss"] == np.mean(sampled)
        weights = np.array(sampled) + 1.0
        expected_buffer = float(np.dot(weights / weights.sum(), sampled))     # n_i-weighted (spec A8)
        assert torch.allclose(server.buffers, torch.full_like(server.buffers, expected_buffer))
        if "test_accuracy" in metrics:
            evaluated.append(metrics["round"])
    assert evaluated == [3, 6, 7]          # every eval_every rounds, and after the last
