"""engine.vectorize: a worker's clients trained as one batch equal sequential training, within
the documented tolerance; where the algorithm or model cannot be batched, the run says so and
trains sequentially."""
import itertools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from rayfed.algorithms.base import AlgorithmContext, build_algorithm
from rayfed.algorithms.local_training import TrainingTask
from rayfed.preflight import load_config
from rayfed.engine import vectorized, worker
from rayfed.engine.vectorized import BatchedModule, ClientBatchTask, vectorize_blocker
from rayfed.engine.worker import ClientTask, assign_to_workers
from rayfed.models import FlatModel, build_model
from rayfed.models.zoo import lenet5
from rayfed.seeding import Purpose, seed_global_torch, torch_generator
from tests.test_engine_equivalence import assert_same_run, run

# 50-64 samples per client, batches of 32: the second step's batches differ in size between
# clients, so the padding of the batched minibatches is exercised.
SMALL = ["engine.backend=local", "data.num_clients=40", "train.clients_per_round=9", "train.rounds=4",
         "train.local_steps=3", "train.batch_size=32", "data.synthetic_max_samples=64", "model.name=logreg",
         "train.eval_every=2", "algorithm.lr_local=0.05"]
# The tolerance docs/concepts/performance.md documents for engine.vectorize.
RTOL, ATOL = 1e-5, 1e-6
# And for BatchNorm models whose clients' minibatches differ in length: minibatches of a few rows, which
# such partitions bring, make BatchNorm's float32 gradient mostly rounding (performance.md).
BN_RTOL, BN_ATOL = 1e-4, 1e-5


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


@pytest.mark.parametrize("overrides", [
    ["algorithm.name=scaffold", "algorithm.lr_global=0.8"],
    ["algorithm.name=scaffold", "train.lr_decay=0.9", "train.max_grad_norm=1", "train.weight_decay=0.01"],
    ["algorithm.name=fedcom", "compression.name=qsgd"],
])
def test_vectorized_clients_with_states_or_compressed_uploads_match_sequential_training(tmp_path, overrides):
    """Each client trains from its own state (ClientStates) and keeps the state it trained into;
    compressed uploads are encoded row by row, each from its client's stream."""
    sequential = run(tmp_path, SMALL + overrides, "sequential")
    vectorized = run(tmp_path, SMALL + overrides + ["engine.vectorize=true"], "vectorized")
    assert vectorized.summary["vectorized"]
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=RTOL, atol=ATOL)
    for seq_round, vec_round in zip(sequential.history, vectorized.history):
        assert vec_round["train_loss"] == pytest.approx(seq_round["train_loss"], rel=RTOL)
        assert vec_round.keys() == seq_round.keys()
        for key in ("client_message_bits_mean", "compression_error", "bits_up"):
            assert vec_round.get(key) == pytest.approx(seq_round.get(key), rel=1e-4)
    assert ("compression_error" in vectorized.history[0]) == ("compression.name=qsgd" in overrides)


# Batches of 48: the clients hold 45 to 57 samples, so some train on minibatches shorter than the batch size
# throughout and others' second minibatch has 2 to 12 rows.
BATCHNORM_MLP = SMALL + ["model.name=mlp", "model.hidden_sizes=[16]", "train.batch_size=48", "train.rounds=2"]


def test_batchnorm_clients_of_different_sizes_match_sequential_training(tmp_path):
    """Each client normalises with its own rows' statistics and keeps its own running statistics, whatever
    the padding of the batched minibatches."""
    sequential = run(tmp_path, BATCHNORM_MLP, "sequential")
    vectorized = run(tmp_path, BATCHNORM_MLP + ["engine.vectorize=true"], "vectorized")
    assert vectorized.summary["vectorized"] and sequential.buffers.numel() > 0
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=BN_RTOL, atol=BN_ATOL)
    torch.testing.assert_close(vectorized.buffers, sequential.buffers, rtol=BN_RTOL, atol=BN_ATOL)
    for seq_round, vec_round in zip(sequential.history, vectorized.history):
        assert vec_round["train_loss"] == pytest.approx(seq_round["train_loss"], rel=BN_RTOL)


UNBATCHED = '''
import rayfed


@rayfed.register_algorithm("vectorize_test_unbatched")
class Unbatched(rayfed.Algorithm):
    """FedAvg's local SGD and mean, without declaring vectorizable."""

    keeps_client_state = False

    def __init__(self, params, context):
        self.lr_local = params.lr_local

    def server_init(self, params, num_clients):
        return params.clone()

    def broadcast(self, state):
        return {"params": state}

    def global_params(self, state):
        return state

    def client_train(self, task, down, client_state):
        params, loss = rayfed.local_sgd(task, down["params"], self.lr_local)
        return rayfed.Upload({"change": params - down["params"]}, task.num_samples, {"train_loss": loss}), None

    def server_step(self, state, uploads, round_info):
        return state + rayfed.weighted_average(uploads, "change", "uniform"), {}
'''


@pytest.fixture
def unbatched_plugin(tmp_path, monkeypatch):
    """The plugin file declaring an algorithm without a batched step, loaded by the runs that name it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "unbatched.py").write_text(UNBATCHED)
    yield
    from tests.test_plugins import forget_plugins
    forget_plugins()


@pytest.mark.parametrize("overrides, reason", [
    (["plugins=[./unbatched.py]", "algorithm.name=vectorize_test_unbatched"],
     "algorithm vectorize_test_unbatched has no batched local step (it does not declare vectorizable)"),
    (["train.local_epochs=1", "train.batch_size=16"], "local epochs give this partition's clients different numbers"),
])
def test_unbatchable_runs_say_why_and_train_sequentially(tmp_path, capsys, unbatched_plugin, overrides, reason):
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


def lenet(cifar_lenet, *overrides):
    """LeNet-5 (BatchNorm and dropout) on the engine tests' CIFAR files: 20 samples per client, batches of 10."""
    return [*cifar_lenet, "engine.backend=local", "algorithm.name=fedavg", "algorithm.lr_local=0.05",
            "train.batch_size=10", "train.local_steps=3", "train.clients_per_round=3", *overrides]


# The same files split unequally: the sampled clients hold 12 to 29 samples, so minibatches of 16 differ in
# length, some clients' are shorter than 16 throughout, and one of 2 rows comes.
UNEQUAL_LENET = ["data.partition=dirichlet", "data.alpha=1", "train.batch_size=16"]


class DeclaredOutOfOrder(nn.Module):
    """BatchNorm and dropout layers called in another order than they are declared, one of each called
    twice, and a BatchNorm layer never called."""

    def __init__(self):
        super().__init__()
        self.late, self.unused, self.early = nn.BatchNorm1d(10), nn.BatchNorm1d(16), nn.BatchNorm1d(16)
        self.narrow_dropout, self.wide_dropout = nn.Dropout(0.6), nn.Dropout(0.3)
        self.fc1, self.fc2, self.fc3 = nn.Linear(3 * 32 * 32, 16), nn.Linear(16, 16), nn.Linear(16, 10)

    def forward(self, images):
        hidden = self.wide_dropout(torch.relu(self.early(self.fc1(images.flatten(1)))))
        hidden = self.wide_dropout(torch.relu(self.early(self.fc2(hidden))))
        return self.late(self.narrow_dropout(self.fc3(hidden)))


@pytest.mark.parametrize("algorithm, model_name, sizes", [
    ("fedavg", "lenet5", [20, 20, 20]), ("stem", "lenet5", [20, 20, 20]), ("fedmos", "lenet5", [20, 20, 20]),
    ("fedavg", "resnet20", [20, 20, 20]), ("fedavg", "cifar_cnn_ref", [20, 20, 20]),
    ("fedavg", "out of order", [20, 20, 20]),
    # Minibatches of 10, 10 and 7 rows, then 10, 3 and 7: padded; STEM's full gradient in chunks of 8 (below),
    # where the clients hold 8, 8 and 7 rows, then 8 and 5, then 4.
    ("fedavg", "lenet5", [20, 13, 7]), ("stem", "lenet5", [20, 13, 7]), ("fedmos", "lenet5", [20, 13, 7]),
    ("fedavg", "mlp", [20, 13, 7]), ("fedavg", "out of order", [20, 13, 7]),
])
def test_batchnorm_and_dropout_clients_train_batched_as_they_would_alone(monkeypatch, algorithm, model_name, sizes):
    """In float64, where BatchNorm's backward does not magnify float32 rounding: each client's model change,
    loss and running statistics equal its sequential training's, through plain steps, STEM's full gradient
    and paired passes, and FedMoS's, with the clients' minibatches of one length or padded."""
    monkeypatch.setattr(vectorized, "FULL_GRADIENT_CHUNK", 8)
    monkeypatch.setattr(worker, "FULL_GRADIENT_CHUNK", 8)
    torch.manual_seed(0)
    module = DeclaredOutOfOrder() if model_name == "out of order" else build_model(model_name, (3, 32, 32), 10, [16])
    model = FlatModel(module.double())
    start, start_buffers = model.params.clone(), model.buffers.clone()
    config = load_config(None, [f"algorithm.name={algorithm}", "algorithm.lr_local=0.05", "train.local_steps=3"])
    algorithm = build_algorithm(config.algorithm, AlgorithmContext.of_run(model, config.train, config.algorithm))
    clients, offsets = [0, 1, 2], [0, *itertools.accumulate(sizes)]
    inputs = torch.randn(offsets[-1], 3, 32, 32, dtype=torch.float64)
    targets = torch.randint(0, 10, (offsets[-1],))

    def client_task(client):     # batches of 10
        return ClientTask(model, inputs, targets, torch.arange(offsets[client], offsets[client + 1]), 10,
                          torch_generator(0, Purpose.BATCHES, 0, client))
    sequential = []
    for client in clients:
        seed_global_torch(100 + client, model.device)
        model.buffers.copy_(start_buffers)
        upload = algorithm.client_train(TrainingTask(client_task(client), 3), {"params": start}, None)[0]
        sequential.append((upload.tensors["model_change"].clone(), upload.metrics["train_loss"], model.buffers.clone()))
    batch = ClientBatchTask(model, BatchedModule(model.module), [client_task(c) for c in clients], start_buffers,
                            [100 + client for client in clients])
    upload = algorithm.client_train(TrainingTask(batch, 3), {"params": start}, None)[0]
    for client, (change, loss, buffers) in enumerate(sequential):
        torch.testing.assert_close(upload.tensors["model_change"][client], change, rtol=1e-9, atol=1e-12)
        assert float(upload.metrics["train_loss"][client]) == pytest.approx(loss, rel=1e-12)
        torch.testing.assert_close(batch.buffers()[client], buffers, rtol=1e-12, atol=1e-12)
        assert start_buffers.numel() == 0 or not torch.equal(buffers, start_buffers)


@pytest.mark.parametrize("sizes", [[], UNEQUAL_LENET])
def test_batchnorm_and_dropout_runs_carry_each_clients_statistics(tmp_path, cifar_lenet, sizes):
    """The same in float32 runs, uploads and partial sums: the server averages the clients' own running
    statistics. The float64 tests above hold the values to 1e-9; in float32 a batched and a sequential
    pass round differently (about 1e-7), and now and then that flips a ReLU or a max-pool's choice,
    which moves the rest of the run by up to about 1e-3 (on AVX2 kernels: seed 0 here after its fourth
    step; docs/concepts/performance.md). So the statistics are held to 1e-3 against their own movement
    from BatchNorm's initial 0 and 1, which a run that did not carry the clients' statistics misses."""
    overrides = lenet(cifar_lenet, "train.rounds=2", "train.local_steps=2", *sizes)
    sequential = run(tmp_path, overrides, "sequential")
    initial = FlatModel(lenet5((3, 32, 32), 10)).buffers
    assert (sequential.buffers - initial).abs().max() > 0.05
    for extra in ([], ["engine.partial_sums=true"]):
        batched = run(tmp_path, overrides + extra + ["engine.vectorize=true"], "vectorized" + "".join(extra))
        assert batched.summary["vectorized"]
        torch.testing.assert_close(batched.params, sequential.params, rtol=0, atol=5e-3)
        torch.testing.assert_close(batched.buffers, sequential.buffers, rtol=0, atol=1e-3)


@pytest.mark.parametrize("sizes", [[], UNEQUAL_LENET])
@pytest.mark.parametrize("algorithm, draw_of_forward", [
    ("fedavg", lambda forward: forward),
    # STEM's first round: a full local gradient (one pass), then per step two passes with the same masks.
    ("stem", lambda forward: 0 if forward == 0 else (forward + 1) // 2),
])
def test_batched_clients_draw_the_dropout_masks_of_their_sequential_training(tmp_path, cifar_lenet, monkeypatch,
                                                                          algorithm, draw_of_forward, sizes):
    """Position by position on each client's own rows; padding rows are dropped."""
    overrides = lenet(cifar_lenet, "train.rounds=1", f"algorithm.name={algorithm}", *sizes)
    passes = []        # sequential training: each dropout layer's (input, output), in train mode
    dropout = nn.Dropout.forward

    def recording(layer, inputs):
        outputs = dropout(layer, inputs)
        if layer.training:
            passes.append((inputs.detach().clone(), outputs.detach().clone()))
        return outputs
    monkeypatch.setattr(nn.Dropout, "forward", recording)
    run(tmp_path, overrides, "sequential")
    monkeypatch.undo()
    draws = []         # batched training: each draw's masks, one stack over the clients per dropout layer
    draw_masks = vectorized.ClientBatchTask._draw_masks

    def kept(task, *args):
        masks = draw_masks(task, *args)
        draws.append(masks)
        return masks
    monkeypatch.setattr(vectorized.ClientBatchTask, "_draw_masks", kept)
    run(tmp_path, overrides + ["engine.vectorize=true"], "vectorized")
    layers, clients = len(draws[0]), draws[0][0].shape[0]
    forwards = len(passes) // (layers * clients)
    assert clients == 3 and draw_of_forward(forwards - 1) == len(draws) - 1
    padded = 0
    for index, (inputs, outputs) in enumerate(passes):
        client, forward, layer = index // (forwards * layers), index // layers % forwards, index % layers
        mask = draws[draw_of_forward(forward)][layer][client]
        rows = inputs.shape[0]
        padded += rows < mask.shape[0]
        assert not mask[rows:].any()
        nonzero = inputs != 0
        assert torch.equal(outputs[nonzero] != 0, mask[:rows][nonzero] != 0)
    assert (padded > 0) == bool(sizes)


@pytest.mark.parametrize("module, reason", [
    (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)), None),
    (nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), None),
    (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=None)),
     "the model has BatchNorm1d layers, whose per-client statistics and random streams a batched computation "
     "does not reproduce"),
    (nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2), nn.Dropout2d(0.5)),
     "the model has Dropout2d, InstanceNorm2d layers, whose per-client statistics and random streams a batched "
     "computation does not reproduce"),
    (lenet5((3, 32, 32), 10), None),
])
def test_which_layers_batch(module, reason):
    assert vectorize_blocker("fedavg", SimpleNamespace(vectorizable=True), module) == reason
