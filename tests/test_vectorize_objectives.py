"""engine.vectorize with local objectives (MOON, MOONM, FedMLB, FedMLBM, a plugin's loss): each client's
objective, its frozen passes at its own rows (the global model, its previous model), equals its
sequential training within the documented tolerance, padded batches counting only real rows."""
import pytest
import torch
import torch.nn.functional as F

from rayfed.algorithms.base import AlgorithmContext, ClientStates, build_algorithm, local_sgd
from rayfed.algorithms.local_training import TrainingTask
from rayfed.algorithms.moon import MoonClientState
from rayfed.algorithms.objective import LocalObjective
from rayfed.engine.vectorized import BatchedModule, ClientBatchTask
from rayfed.engine.worker import ClientTask
from rayfed.models import FlatModel, build_model
from rayfed.preflight import load_config
from rayfed.seeding import Purpose, seed_global_torch, torch_generator
from tests.test_engine_equivalence import run
from tests.test_vectorize import ATOL, RTOL, SMALL

# 6 clients, 4 a round: clients come back, and MOON's frozen previous models are the ones they kept.
RETURNING = ["data.num_clients=6", "train.clients_per_round=4"]
# Synthetic clients capped at 12 samples all hold the same number, so BatchNorm layers batch.
EQUAL_SIZES_BATCHNORM = ["data.synthetic_max_samples=12", "model.name=mlp", "model.hidden_sizes=[16,8]"]
# SMALL's clients hold 50-64 samples (batches of 32 padded in the second step), without BatchNorm.
PADDED = ["model.name=relu_mlp", "model.hidden_sizes=[16,8]"]


def assert_matches_sequential(tmp_path, overrides):
    sequential = run(tmp_path, overrides, "sequential")
    vectorized = run(tmp_path, overrides + ["engine.vectorize=true"], "vectorized")
    assert vectorized.summary["vectorized"] and not sequential.summary["vectorized"]
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(vectorized.buffers, sequential.buffers, rtol=RTOL, atol=ATOL)
    assert len(vectorized.history) == len(sequential.history) == 4
    for seq_round, vec_round in zip(sequential.history, vectorized.history):
        assert vec_round["train_loss"] == pytest.approx(seq_round["train_loss"], rel=RTOL)


@pytest.mark.parametrize("algorithm", ["moon", "moonm", "fedmlb", "fedmlbm"])
def test_vectorized_objectives_match_sequential_training(tmp_path, algorithm):
    assert_matches_sequential(tmp_path, SMALL + RETURNING + EQUAL_SIZES_BATCHNORM + [f"algorithm.name={algorithm}"])


@pytest.mark.parametrize("algorithm", ["moonm", "fedmlb"])
def test_padded_batches_count_only_the_clients_own_rows(tmp_path, algorithm):
    assert_matches_sequential(tmp_path, SMALL + RETURNING + PADDED + [f"algorithm.name={algorithm}"])


def plugin_client_train(task, start):
    """The tutorial's MOON-like plugin objective, whose loss takes no per-row weights."""
    frozen = task.forward_at(start, task.buffers())

    def loss(model, inputs, targets):
        z, logits = model.features(inputs)
        with torch.no_grad():
            z_global = frozen.features(inputs)[0]
        return F.cross_entropy(logits, targets) - 0.5 * F.cosine_similarity(z, z_global).mean()

    local, mean_loss = local_sgd(task, start, 0.05, LocalObjective(loss))
    return {"model_change": local - start}, mean_loss, None


@pytest.mark.parametrize("name, model_name, sizes", [
    ("moon", "lenet5", (20, 20, 20)), ("fedmlb", "lenet5", (20, 20, 20)), ("moon", "relu_mlp", (20, 13, 7)),
    ("fedmlbm", "relu_mlp", (20, 13, 7)), ("plugin", "relu_mlp", (20, 13, 7)), ("plugin", "mlp", (20, 20, 20)),
])
def test_objective_clients_train_batched_as_they_would_alone(name, model_name, sizes):
    """In float64: each client's model change, loss, running statistics and MOON's kept model equal its
    sequential training's, through LeNet-5's BatchNorm and dropout (FedMLB's frozen blocks draw masks between
    the trained model's) and through padded batches (clients of 20, 13 and 7 samples, batches of 10), where
    a loss without per-row weights runs once per group of clients with batches of one size (the 13-sample
    client's batches hold 10, 3 and 10 rows)."""
    torch.manual_seed(0)
    model = FlatModel(build_model(model_name, (3, 16, 16), 10, [16, 8]).double())
    start, start_buffers = model.params.clone(), model.buffers.clone()
    config = load_config(None, [f"algorithm.name={'moon' if name == 'plugin' else name}", "model.name=mlp",
                                "algorithm.lr_local=0.05", *(["algorithm.mu=2"] if "moon" in name else [])])
    algorithm = build_algorithm(config.algorithm, AlgorithmContext.of_run(model, config.train, config.algorithm))
    offsets = [sum(sizes[:client]) for client in range(len(sizes) + 1)]
    inputs = torch.randn(offsets[-1], 3, 16, 16, dtype=torch.float64)
    targets = torch.randint(0, 10, (offsets[-1],))
    # The second client comes back with a previous model of its own; the others start from x_0.
    states = ClientStates([None, MoonClientState(start + 0.05 * torch.randn_like(start), start_buffers * 1.5),
                           None]) if "moon" in name else None

    def client_task(client):
        return ClientTask(model, inputs, targets, torch.arange(offsets[client], offsets[client + 1]), 10,
                          torch_generator(0, Purpose.BATCHES, 0, client))

    def train(task, state):
        if name == "plugin":
            return plugin_client_train(task, start)
        upload, state = algorithm.client_train(task, {"params": start}, state)
        return upload.tensors, upload.metrics["train_loss"], state
    sequential = []
    for client in range(len(sizes)):
        seed_global_torch(100 + client, model.device)
        model.buffers.copy_(start_buffers)
        tensors, loss, state = train(TrainingTask(client_task(client), 3), states and states[client])
        sequential.append((tensors["model_change"].clone(), float(loss), model.buffers.clone(), state))
    batch = ClientBatchTask(model, BatchedModule(model.module), [client_task(c) for c in range(len(sizes))],
                            start_buffers, [100 + client for client in range(len(sizes))])
    tensors, losses, batched_states = train(TrainingTask(batch, 3), states)
    assert isinstance(batched_states, ClientStates) == ("moon" in name)
    for client, (change, loss, buffers, state) in enumerate(sequential):
        torch.testing.assert_close(tensors["model_change"][client], change, rtol=1e-9, atol=1e-12)
        assert float(losses[client]) == pytest.approx(loss, rel=1e-12)
        torch.testing.assert_close(batch.buffers()[client], buffers, rtol=1e-12, atol=1e-12)
        assert start_buffers.numel() == 0 or not torch.equal(buffers, start_buffers)
        if state is not None:
            torch.testing.assert_close(batched_states[client].params, state.params, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(batched_states[client].buffers, state.buffers, rtol=1e-12, atol=1e-12)


def test_padding_rows_leave_a_hybrid_pathways_gradient_finite():
    """FedMLB in float32 on the BatchNorm MLP: a client of 2 samples beside one of 9, its minibatch padded to 64
    rows. Padding rows of another sample, normalised with the 2 samples' statistics, grew until the hybrid
    pathways' softmax underflowed to 0 there, whose KL gradient (log 0) times the row's weight 0 was a NaN."""
    torch.manual_seed(0)
    model = FlatModel(build_model("mlp", (1, 28, 28), 10, [200, 100]))
    start, start_buffers = model.params.clone(), model.buffers.clone()
    config = load_config(None, ["algorithm.name=fedmlb", "model.name=mlp", "algorithm.lr_local=0.05"])
    algorithm = build_algorithm(config.algorithm, AlgorithmContext.of_run(model, config.train, config.algorithm))
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(11, 1, 28, 28, generator=generator), torch.randint(0, 10, (11,), generator=generator)
    samples = [torch.arange(0, 9), torch.arange(9, 11)]

    def client_task(client):
        return ClientTask(model, inputs, targets, samples[client], 64, torch_generator(0, Purpose.BATCHES, 0, client))
    sequential = []
    for client in range(2):
        seed_global_torch(100 + client, model.device)
        model.buffers.copy_(start_buffers)
        upload, _ = algorithm.client_train(TrainingTask(client_task(client), 1), {"params": start}, None)
        sequential.append(upload.tensors["model_change"].clone())
    batch = ClientBatchTask(model, BatchedModule(model.module), [client_task(c) for c in range(2)], start_buffers,
                            [100, 101])
    upload, _ = algorithm.client_train(TrainingTask(batch, 1), {"params": start}, None)
    assert upload.tensors["model_change"].isfinite().all()
    for client, change in enumerate(sequential):
        # float32 rounding on 2 rows of BatchNorm, about 1e-4 from float64 either way (docs/concepts/performance.md)
        torch.testing.assert_close(upload.tensors["model_change"][client], change, rtol=0, atol=1e-3)
