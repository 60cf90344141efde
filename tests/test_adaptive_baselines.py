"""FedAdam, FedYogi, FedAdagrad, FedAMS-V1/V2 and LaFedOPT against the baseline checks of
specs/fedlalr.md §7 (B1-B5), in float64."""
import pytest
import torch

from rayfed.algorithms.base import RoundInfo, Upload
from rayfed.algorithms.lafedopt import LaFedOPT
from rayfed.algorithms.local_adaptive import AdamDirection
from rayfed.algorithms.server_optimizer import ServerOptimizer
from tests.fakes import QuadraticTask, ScriptedTask, make

TIGHT = dict(rtol=1e-12, atol=1e-12)
DIM = 4


def deltas(rounds, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(rounds, DIM, generator=generator, dtype=torch.float64)


def run_optimizer(optimizer, pseudo_gradients):
    params = torch.zeros(DIM, dtype=torch.float64)
    state = optimizer.init(params)
    states = [state]
    for delta in pseudo_gradients:
        params, state = optimizer.step(params, delta, state)
        states.append(state)
    return params, states


def test_b1_server_sgd_with_unit_rate_is_model_averaging():
    x = torch.randn(DIM, dtype=torch.float64)
    models = x + deltas(5)
    params, _ = ServerOptimizer("sgd", 1.0).step(x, (models - x).mean(0), None)
    torch.testing.assert_close(params, models.mean(0), **TIGHT)


def test_b2_fedadam_without_moments_steps_by_delta_over_its_magnitude_plus_tau():
    tau, eta = 0.01, 0.3
    optimizer = ServerOptimizer("adam", eta, beta1=0.0, beta2=0.0, eps=tau)
    x = torch.randn(DIM, dtype=torch.float64)
    state = optimizer.init(x)
    assert torch.equal(state.v, torch.full((DIM,), tau ** 2, dtype=torch.float64))
    for delta in deltas(3):
        new_x, state = optimizer.step(x, delta, state)
        torch.testing.assert_close(new_x, x + eta * delta / (delta.abs() + tau), **TIGHT)
        x = new_x
    beta2 = 0.99
    delta = deltas(1)[0]
    _, first = ServerOptimizer("adam", eta, beta1=0.9, beta2=beta2, eps=tau).step(x, delta, state=ServerOptimizer(
        "adam", eta, 0.9, beta2, tau).init(x))
    torch.testing.assert_close(first.v, beta2 * tau ** 2 + (1 - beta2) * delta ** 2, **TIGHT)


def test_b3_adagrad_accumulates_and_yogi_moves_by_the_sign_of_the_gap():
    _, states = run_optimizer(ServerOptimizer("adagrad", 0.1, eps=1e-3), deltas(6))
    for before, after in zip(states, states[1:]):
        assert (after.v >= before.v).all()
    beta2 = 0.9
    pseudo = deltas(6, seed=1, scale=2.0)
    _, states = run_optimizer(ServerOptimizer("yogi", 0.1, beta1=0.9, beta2=beta2, eps=1e-3), pseudo)
    for before, after, delta in zip(states, states[1:], pseudo):
        change, gap = after.v - before.v, delta ** 2 - before.v
        assert torch.equal(torch.sign(change), torch.sign(gap))
        torch.testing.assert_close(change.abs(), (1 - beta2) * delta ** 2 * (gap != 0), **TIGHT)


def test_b4_fedams_max_stabilisation_and_additive_eps():
    eps, beta2, eta = 1e-4, 0.99, 0.1
    pseudo = deltas(8, seed=2, scale=1e-3)
    _, states = run_optimizer(ServerOptimizer("ams_v1", eta, beta1=0.9, beta2=beta2, eps=eps), pseudo)
    for before, after in zip(states[1:], states[2:]):
        assert (after.v_hat >= eps).all() and (after.v_hat >= before.v_hat).all()
    _, states = run_optimizer(ServerOptimizer("ams_v2", eta, beta1=0.9, beta2=beta2, eps=1e-2), pseudo)
    for before, after in zip(states, states[1:]):
        assert (after.v_hat >= before.v_hat).all()
    constant = torch.tensor([1e-3, -0.5, 2.0, 1e-5], dtype=torch.float64)
    x = torch.zeros(DIM, dtype=torch.float64)
    v1 = ServerOptimizer("ams_v1", eta, beta1=0.0, beta2=beta2, eps=eps)
    stepped, _ = v1.step(x, constant, v1.init(x))
    expected = eta * constant / torch.sqrt(torch.maximum((1 - beta2) * constant ** 2, torch.tensor(eps, dtype=torch.float64)))
    torch.testing.assert_close(stepped, expected, **TIGHT)
    v2 = ServerOptimizer("ams_v2", eta, beta1=0.0, beta2=beta2, eps=1e-2)
    stepped, _ = v2.step(x, constant, v2.init(x))
    torch.testing.assert_close(stepped, eta * constant / (torch.sqrt((1 - beta2) * constant ** 2) + 1e-2), **TIGHT)


@pytest.mark.parametrize("name, rule", [("fedadam", "adam"), ("fedyogi", "yogi"), ("fedadagrad", "adagrad"),
                                        ("fedams_v1", "ams_v1"), ("fedams_v2", "ams_v2")])
def test_the_fedopt_family_is_fedavg_clients_and_one_server_optimizer_step(name, rule):
    algorithm = make(name, lr_local=0.05, lr_global=0.2)
    state = algorithm.server_init(torch.zeros(DIM, dtype=torch.float64), 6)
    assert algorithm.optimizer.rule == rule and set(algorithm.broadcast(state)) == {"params"}
    optimizer_state = algorithm.optimizer.init(state.params)
    x = state.params.clone()
    for round in range(3):
        down = algorithm.broadcast(state)
        uploads = {c: algorithm.client_train(QuadraticTask(c), down, None)[0] for c in (1, 4)}
        state, _ = algorithm.server_step(state, uploads, RoundInfo(round, (1, 4), 6))
        models = []
        for client in (1, 4):
            task, y = QuadraticTask(client), x.clone()
            for step in range(task.steps):
                y = y - 0.05 * task.loss_and_grad(y, step)[1]
            models.append(y)
        x, optimizer_state = algorithm.optimizer.step(x, (models[0] + models[1]) / 2 - x, optimizer_state)
        torch.testing.assert_close(state.params, x, **TIGHT)
    assert all(upload.nbytes == DIM * 8 for upload in uploads.values())


def test_bias_correction_of_the_server_optimizer_is_adams_first_step():
    delta = deltas(1)[0]
    optimizer = ServerOptimizer("adam", 0.1, beta1=0.9, beta2=0.99, eps=0.0, bias_correction=True)
    x = torch.zeros(DIM, dtype=torch.float64)
    state = optimizer.init(x)
    state.v = torch.zeros_like(x)
    stepped, _ = optimizer.step(x, delta, state)
    torch.testing.assert_close(stepped, 0.1 * torch.sign(delta), **TIGHT)


def test_b5_joint_correction_with_sgd_preconditioners_is_fednova_and_fedavg_for_equal_steps():
    algorithm = LaFedOPT(0.1, 1.0, beta1=0.0, beta2=0.0, eps=1e-8)
    x = torch.zeros(DIM, dtype=torch.float64)
    updates = deltas(3, seed=4)
    weights = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)

    def server(steps):
        # What SGD clients would send: p = 1, a = 1, c = K_i, so u_i = Delta_i / K_i and r_i = 1 / K_i.
        uploads = {c: Upload({"scaled_update": updates[c] / k, "inverse_preconditioner_sum": torch.full((DIM,), 1 / k,
                                                                                              dtype=torch.float64)},
                             num_samples=int(10 * weights[c])) for c, k in enumerate(steps)}
        algorithm.agg_weighting = "num_samples"
        return algorithm.server_step(algorithm.server_init(x, 3), uploads, RoundInfo(0, (0, 1, 2), 3))[0].params

    unequal = (2, 5, 3)
    expected = sum(w * u / k for w, u, k in zip(weights, updates, unequal)) / sum(w / k for w, k in
                                                                                   zip(weights, unequal))
    torch.testing.assert_close(server(unequal), expected, **TIGHT)
    torch.testing.assert_close(server((4, 4, 4)), (weights[:, None] * updates).sum(0), **TIGHT)


def test_lafedopt_clients_run_fresh_torch_adam_and_sum_their_preconditioners():
    lr, beta1, beta2, eps = 0.01, 0.8, 0.999, 1e-4
    algorithm = make("lafedopt", lr_local=lr, lr_global=1.0, beta1=beta1, beta2=beta2, eps=eps)
    x0 = torch.ones(DIM, dtype=torch.float64)
    upload = algorithm.client_train(QuadraticTask(2, steps=5), {"params": x0}, None)[0]
    again = algorithm.client_train(QuadraticTask(2, steps=5), {"params": x0}, None)[0]
    assert torch.equal(upload.tensors["scaled_update"], again.tensors["scaled_update"])     # fresh state each time
    task, x = QuadraticTask(2, steps=5), x0.clone().requires_grad_(True)
    adam = torch.optim.Adam([x], lr=lr, betas=(beta1, beta2), eps=eps)
    a, c = torch.zeros(DIM, dtype=torch.float64), torch.zeros(DIM, dtype=torch.float64)
    for step in range(5):
        x.grad = task.loss_and_grad(x.detach(), step)[1]
        adam.step()
        p = 1 / (adam.state[x]["exp_avg_sq"].sqrt() + eps)
        a = beta1 * a + (1 - beta1) * p
        c = c + a
    torch.testing.assert_close(upload.tensors["inverse_preconditioner_sum"], 1 / c, **TIGHT)
    torch.testing.assert_close(upload.tensors["scaled_update"], (x.detach() - x0) / c, **TIGHT)
    assert upload.nbytes == 2 * DIM * 8


def test_adam_direction_is_torch_adam():
    gradients = deltas(6, seed=5)
    direction = AdamDirection(torch.zeros(DIM, dtype=torch.float64), 0.9, 0.99, 1e-3)
    ours = torch.zeros(DIM, dtype=torch.float64)
    x = torch.zeros(DIM, dtype=torch.float64, requires_grad=True)
    adam = torch.optim.Adam([x], lr=0.1, betas=(0.9, 0.99), eps=1e-3)
    for step, g in enumerate(gradients, start=1):
        ours = ours - 0.1 * direction(g, ours, step)
        x.grad = g.clone()
        adam.step()
    torch.testing.assert_close(ours, x.detach(), **TIGHT)


def test_lafedopt_local_correction_averages_the_scaled_updates():
    algorithm = make("lafedopt", lr_local=0.01, lr_global=0.5, correction="local")
    x = torch.zeros(DIM, dtype=torch.float64)
    uploads = {c: algorithm.client_train(ScriptedTask(list(deltas(3, seed=c))), {"params": x}, None)[0]
               for c in (0, 1)}
    stepped = algorithm.server_step(algorithm.server_init(x, 2), uploads, RoundInfo(0, (0, 1), 2))[0].params
    torch.testing.assert_close(stepped, 0.5 * (uploads[0].tensors["scaled_update"] +
                                               uploads[1].tensors["scaled_update"]) / 2, **TIGHT)
