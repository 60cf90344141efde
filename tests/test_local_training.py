"""The local-training options every algorithm shares (train.*): step counts from local epochs and
the adaptive interval (specs/fedlalr.md §3.3, C22), learning-rate decay (C18), weight decay and
clipping; and the traffic each FedLALR-family algorithm reports (C23)."""
import pytest
import torch

import rayfed
from rayfed.algorithms.local_training import LocalSchedule, TrainingTask, integer_log
from rayfed.errors import ConfigError
from tests.fakes import ScriptedTask

# §3.3's table: K_t for t = 1..100 as runs of (first round, last round, K_t).
SCHEDULES = {
    (4, 2, "floor"): [(1, 1, 4), (2, 3, 5), (4, 7, 6), (8, 15, 7), (16, 31, 8), (32, 63, 9), (64, 100, 10)],
    (4, 2, "ceil"): [(1, 1, 4), (2, 2, 5), (3, 4, 6), (5, 8, 7), (9, 16, 8), (17, 32, 9), (33, 64, 10),
                     (65, 100, 11)],
    (3, 4, "floor"): [(1, 3, 3), (4, 15, 4), (16, 63, 5), (64, 100, 6)],
    (3, 4, "ceil"): [(1, 1, 3), (2, 4, 4), (5, 16, 5), (17, 64, 6), (65, 100, 7)],
}
SUMS = {(4, 2, "floor"): 880, (4, 2, "ceil"): 973, (3, 4, "floor"): 519, (3, 4, "ceil"): 615}


def adaptive(k_init, k_alpha, rounding, unit="steps", batch_size=50):
    return LocalSchedule(local_steps=5, batch_size=batch_size, interval="adaptive", k_init=k_init,
                         k_alpha=float(k_alpha), rounding=rounding, interval_unit=unit)


@pytest.mark.parametrize("setting", list(SCHEDULES))
def test_c22_adaptive_interval_matches_the_specs_table(setting):
    schedule = adaptive(*setting)
    lengths = [schedule.steps(t - 1, 500) for t in range(1, 101)]
    expected = [k for first, last, k in SCHEDULES[setting] for _ in range(first, last + 1)]
    assert lengths == expected and sum(lengths) == SUMS[setting]
    assert lengths == sorted(lengths)
    in_epochs = adaptive(*setting, unit="epochs")
    assert [in_epochs.steps(t, 500) for t in range(100)] == [10 * k for k in lengths]   # 500 samples, batches of 50


def test_integer_log_is_exact_at_powers():
    assert [integer_log(v, 10.0, "floor") for v in (1, 9, 10, 999, 1000, 1001)] == [0, 0, 1, 2, 3, 3]
    assert [integer_log(v, 10.0, "ceil") for v in (1, 9, 10, 999, 1000, 1001)] == [0, 1, 1, 3, 3, 4]
    assert integer_log(2 ** 40, 2.0, "floor") == 40 == integer_log(2 ** 40, 2.0, "ceil")


def test_local_epochs_and_fixed_steps():
    schedule = LocalSchedule(local_steps=7, batch_size=50, local_epochs=5)
    assert schedule.steps(3, 500) == 50 and schedule.steps(3, 502) == 55 and schedule.steps(0, 20) == 5
    # 501 = 10 batches of 50 and one of 1, which the worker skips: an epoch is 10 batches
    assert schedule.steps(3, 501) == 50
    assert LocalSchedule(local_steps=7, batch_size=50).steps(9, 500) == 7


def test_c18_the_decay_is_per_round():
    schedule = LocalSchedule(local_steps=3, batch_size=8, lr_decay=0.998)
    assert [schedule.lr_factor(t) for t in (0, 1, 10)] == [1.0, 0.998, 0.998 ** 10]
    assert LocalSchedule(local_steps=3, batch_size=8).lr_factor(50) == 1.0


def test_clipping_is_torchs_clip_grad_norm_then_coupled_decay():
    g = torch.tensor([3.0, -4.0, 12.0], dtype=torch.float64)
    x = torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64)
    task = TrainingTask(ScriptedTask([g]), steps=1, max_grad_norm=6.5, weight_decay=0.1)
    _, clipped = task.loss_and_grad(x, 0)
    parameter = torch.nn.Parameter(x.clone())
    parameter.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([parameter], 6.5)
    torch.testing.assert_close(clipped, parameter.grad + 0.1 * x, rtol=1e-15, atol=0.0)
    stack = torch.stack([g, g / 100])         # a stack of clients: each row clipped by its own norm
    batch = TrainingTask(ScriptedTask([stack]), steps=1, max_grad_norm=6.5)
    _, rows = batch.loss_and_grad(torch.zeros_like(stack), 0)
    torch.testing.assert_close(rows, torch.stack([parameter.grad, g / 100]), rtol=1e-15, atol=0.0)


SYNTHETIC = ["engine.backend=local", "data.num_clients=20", "train.clients_per_round=4", "train.rounds=6",
             "train.eval_every=3", "model.name=logreg", "train.batch_size=16", "algorithm.lr_local=0.01"]


def run(tmp_path, name, *overrides):
    config = rayfed.load_config(None, SYNTHETIC + list(overrides))
    return rayfed.run(config, run_dir=tmp_path / name, progress=False)


@pytest.mark.parametrize("algorithm, down, up", [
    (["algorithm.name=fedlalr"], 3, 3),
    (["algorithm.name=fedlalr", "algorithm.vhat_agg=max"], 3, 3),
    (["algorithm.name=fedlalr", "algorithm.restart_momentum=true"], 2, 2),
    (["algorithm.name=local_amsgrad"], 1, 1),
    (["algorithm.name=fedavg"], 1, 1),
    (["algorithm.name=fedadam"], 1, 1),
    (["algorithm.name=fedams_v1"], 1, 1),
    (["algorithm.name=lafedopt"], 1, 2),
])
def test_c23_traffic_counts_the_vectors_actually_sent(tmp_path, algorithm, down, up):
    result = run(tmp_path, "run", *algorithm)
    d = result.params.numel()
    for metrics in result.history:
        assert metrics["bytes_down"] == metrics["num_sampled"] * down * d * 4
        assert metrics["bytes_up"] == metrics["num_participants"] * up * d * 4


def test_c22_the_run_logs_each_rounds_interval(tmp_path):
    result = run(tmp_path, "adaptive", "algorithm.name=fedlalr", "train.interval=adaptive",
                 "train.interval_unit=steps", "train.interval_k_init=3", "train.interval_k_alpha=2")
    assert [metrics["local_steps"] for metrics in result.history] == [3, 4, 4, 5, 5, 5]
    assert "interval_rounding: floor" in (tmp_path / "adaptive" / "config.yaml").read_text()


def test_c18_the_worker_trains_round_t_with_gamma_to_the_t(tmp_path):
    from rayfed.api import load_data
    from rayfed.engine.worker import ClientWorker
    config = rayfed.load_config(None, SYNTHETIC + ["train.lr_decay=0.9", "train.weight_decay=0.01",
                                                   "train.weight_decay_mode=decoupled", "train.max_grad_norm=2"])
    dataset, partition = load_data(config)
    worker = ClientWorker(config, (dataset.train_x, dataset.train_y), partition, dataset.input_shape,
                          dataset.num_classes)
    for round in (0, 1, 7):
        task = worker._training_task(worker._client_task(round, 3, config.seed), round, 40)
        assert task.lr_factor == 0.9 ** round and task.steps == 5
        assert (task.weight_decay, task.decoupled, task.max_grad_norm) == (0.01, True, 2.0)


def test_decoupled_decay_uses_the_rounds_decayed_rate_and_leaves_the_direction_alone():
    from rayfed.algorithms.base import local_sgd
    from rayfed.algorithms.objective import LocalObjective, Proximal
    x = torch.tensor([1.0, -2.0], dtype=torch.float64)
    g = torch.tensor([0.5, 0.25], dtype=torch.float64)
    task = TrainingTask(ScriptedTask([g, g]), steps=2, lr_factor=0.5, weight_decay=0.1, decoupled=True)
    center = torch.tensor([0.3, 0.3], dtype=torch.float64)
    y, _ = local_sgd(task, x, 0.2, LocalObjective(terms=(Proximal(1.0, center),)))
    expected = x.clone()
    for _ in range(2):      # the proximal term at the undecayed iterate, then x <- (1 - lr lambda) x - lr d
        direction = g + (expected - center)
        expected = expected * (1 - 0.1 * 0.1) - 0.1 * direction
    torch.testing.assert_close(y, expected, rtol=1e-15, atol=0.0)


def test_the_first_rounds_virtual_upload_is_the_algorithms_size():
    from tests.test_server import make_server
    for name, vectors in (("fedavg", 1), ("lafedopt", 2), ("fedlalr", 3)):
        _, server = make_server(f"algorithm.name={name}")
        assert server.upload_bytes == vectors * server.model.num_params * 4 + server.buffers.numel() * 4


def test_lr_decay_and_weight_decay_change_the_run_and_default_to_off(tmp_path):
    plain = run(tmp_path, "plain", "algorithm.name=fedavg")
    explicit = run(tmp_path, "explicit", "algorithm.name=fedavg", "train.lr_decay=1.0", "train.weight_decay=0.0")
    assert torch.equal(plain.params, explicit.params)
    for option in ("train.lr_decay=0.9", "train.weight_decay=0.01", "train.max_grad_norm=0.01",
                   "train.local_epochs=1"):
        assert not torch.equal(run(tmp_path, option, "algorithm.name=fedavg", option).params, plain.params)


@pytest.mark.parametrize("overrides, message", [
    (["train.interval_k_init=3"], "train.interval_k_init is only used with train.interval=adaptive"),
    (["train.interval=adaptive", "train.local_epochs=2"], "train.local_epochs does not apply with train.interval"),
    (["train.interval=adaptive", "train.interval_k_alpha=1"], r"train.interval_k_alpha=1.0 must be > 1"),
    (["train.lr_decay=0"], r"train.lr_decay=0.0 must be > 0 and at most 1"),
    (["train.weight_decay_mode=l2"], "train.weight_decay_mode='l2' is not one of: coupled, decoupled"),
    (["algorithm.name=fedlalr", "algorithm.lr_global=0.5"], "algorithm.lr_global does not apply to fedlalr"),
    (["algorithm.name=fedadam", "algorithm.eps=0.1"], "algorithm.eps is not a parameter of fedadam"),
    (["algorithm.name=fedlalr", "algorithm.vhat_agg=median"], "algorithm.vhat_agg='median' must be one of: mean, max"),
    (["algorithm.name=fedlalr", "algorithm.eps=0"], r"algorithm.eps=0.0 must be > 0"),
    (["algorithm.name=fedlalr", "algorithm.tau=0.1"], "algorithm.tau is not a parameter of fedlalr"),
    (["algorithm.name=fedlalr", "algorithm.eps=1e-20"], r"algorithm.eps=1e-20 is too small for eps_mode=init"),
    (["algorithm.name=fedlalr", "train.round_policy=async_buffered"],
     "train.round_policy=async_buffered does not apply to fedlalr"),
])
def test_bad_local_training_and_adaptive_keys_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        rayfed.load_config(None, overrides)
