"""FedLALR, restart momentum, max aggregation and naive local AMSGrad against the checks of
specs/fedlalr.md §7 (C1-C21), in float64 on deterministic problems."""
import functools
import itertools

import pytest
import torch

from rayfed.algorithms import fedlalr as fedlalr_module
from rayfed.algorithms.base import RoundInfo
from rayfed.algorithms.fedlalr import FedLALRState
from rayfed.algorithms.local_adaptive import AMSGradDirection
from rayfed.algorithms.local_training import TrainingTask
from tests.fakes import QuadraticTask, ScriptedTask, make, run_rounds

TIGHT = dict(rtol=1e-12, atol=1e-12)
DIM = 4


def fedlalr(name="fedlalr", **hyper):
    return make(name, lr_global=1.0, **{"lr_local": 0.05, **hyper})


def start(algorithm, dim=DIM):
    return algorithm.server_init(torch.zeros(dim, dtype=torch.float64), 6)


def one_round(algorithm, state, tasks, round=0, weights=None):
    """Trains every task from the state's broadcast; returns the next state and the uploads."""
    down = algorithm.broadcast(state)
    uploads = {client: algorithm.client_train(task, down, None)[0] for client, task in sorted(tasks.items())}
    if weights is not None:
        for client, upload in uploads.items():
            upload.num_samples = weights[client]
    next_state, _ = algorithm.server_step(state, uploads, RoundInfo(round, tuple(sorted(tasks)), 6))
    return next_state, uploads


def reference_amsgrad(gradient_at, x, steps, alpha, beta1, beta2, eps, reset_every=None):
    """AMSGrad in the paper's form, written out: m = 0, v = v_hat = eps^2, no bias correction, the
    denominator sqrt(v_hat); with `reset_every`, v <- v_hat at each round boundary."""
    x = x.clone()
    m, v, v_hat = torch.zeros_like(x), torch.full_like(x, eps ** 2), torch.full_like(x, eps ** 2)
    for step in range(steps):
        if reset_every and step and step % reset_every == 0:
            v = v_hat.clone()
        g = gradient_at(step, x)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        v_hat = torch.maximum(v_hat, v)
        x = x - alpha * m / torch.sqrt(v_hat)
    return x


class Recording(AMSGradDirection):
    """AMSGradDirection that keeps (v_before, m, v, v_hat) after every step."""
    steps: list = []

    def __call__(self, grad, params, step):
        v_before = self.v
        direction = super().__call__(grad, params, step)
        Recording.steps.append((v_before, self.m.clone(), self.v.clone(), self.v_hat.clone(), grad.clone()))
        return direction


@pytest.fixture
def recording(monkeypatch):
    Recording.steps = []
    monkeypatch.setattr(fedlalr_module, "AMSGradDirection", Recording)
    return Recording.steps


def clipped_random_gradients(seed, steps, bound, dim=DIM):
    generator = torch.Generator().manual_seed(seed)
    return list((torch.rand(steps, dim, generator=generator, dtype=torch.float64) * 2 - 1) * bound)


# ---- FedLALR core ----

def test_c1_initial_state_is_zero_momentum_and_eps_squared():
    state = start(fedlalr(eps=1e-3))
    assert torch.equal(state.momentum, torch.zeros(DIM, dtype=torch.float64))
    assert torch.equal(state.v_hat, torch.full((DIM,), 1e-6, dtype=torch.float64))
    assert set(fedlalr().broadcast(state)) == {"params", "momentum", "v_hat"}


@pytest.mark.parametrize("vhat_agg", ["mean", "max"])
def test_c2_c3_bounds_and_within_round_monotonicity(recording, vhat_agg):
    bound, eps, alpha = 2.0, 0.1, 0.05
    algorithm = fedlalr(eps=eps, lr_local=alpha, vhat_agg=vhat_agg)
    state = start(algorithm)
    for round in range(4):
        tasks = {client: ScriptedTask(clipped_random_gradients(10 * round + client, 5, bound)) for client in range(3)}
        recording.clear()
        state, _ = one_round(algorithm, state, tasks, round)
        for index, (_, m, _, v_hat, _) in enumerate(recording):
            assert (v_hat >= eps ** 2).all() and (v_hat <= bound ** 2).all() and (m.abs() <= bound).all()
            rate = alpha / v_hat.sqrt()
            assert (rate >= alpha / bound - 1e-15).all() and (rate <= alpha / eps + 1e-12).all()
            if index % 5:
                assert (v_hat >= recording[index - 1][3]).all()          # C3, within a client's round
        assert (state.v_hat >= eps ** 2).all() and (state.v_hat <= bound ** 2).all()
        assert (state.momentum.abs() <= bound).all()


@pytest.mark.parametrize("vhat_agg, weighting", list(itertools.product(["mean", "max"], ["uniform", "num_samples"])))
def test_c4_the_synchronised_v_hat_never_decreases(vhat_agg, weighting):
    algorithm = fedlalr(vhat_agg=vhat_agg, agg_weighting=weighting, beta2=0.9)
    state = start(algorithm)
    for round in range(8):
        sampled = [(round + k) % 6 for k in range(1 + round % 3)]        # partial participation, S varies
        tasks = {client: QuadraticTask(client, steps=3, scale=0.5 + round) for client in sampled}
        new_state, _ = one_round(algorithm, state, tasks, round, weights={c: 3 + c for c in sampled})
        assert (new_state.v_hat >= state.v_hat).all()
        state = new_state


@pytest.mark.parametrize("weighting", ["uniform", "num_samples"])
def test_c4_holds_in_float32_where_no_client_raises_a_coordinate(weighting):
    """A rounded mean of equal values may fall an ulp below them; the synchronised v_hat must not."""
    algorithm = fedlalr(agg_weighting=weighting, eps=1e-3)
    generator = torch.Generator().manual_seed(7)
    v_hat = torch.rand(1000, generator=generator) * 3e-3 + 1e-6
    state = FedLALRState(torch.zeros(1000), torch.zeros(1000), v_hat)
    tasks = {client: ScriptedTask([torch.zeros(1000, dtype=torch.float64)]) for client in range(7)}
    for task in tasks.values():
        task.gradients = [torch.zeros(1000)]
    new_state, _ = one_round(algorithm, state, tasks, weights={c: 3 + c for c in range(7)})
    assert (new_state.v_hat >= v_hat).all() and (new_state.v_hat >= 1e-6).all()


def test_c5_c7_clients_start_from_the_broadcast_whatever_they_did_before(recording):
    beta1, beta2, alpha = 0.8, 0.9, 0.05
    algorithm = fedlalr(beta1=beta1, beta2=beta2, lr_local=alpha)
    x, m = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64), torch.tensor([0.1, -0.2, 0.0, 0.3],
                                                                                  dtype=torch.float64)
    v_hat = torch.tensor([4.0, 0.01, 1.0, 0.25], dtype=torch.float64)
    g = torch.tensor([0.5, 1.0, -3.0, 0.2], dtype=torch.float64)
    # The same client first trains from a large v_hat, then from this smaller one: nothing carries over.
    algorithm.client_train(ScriptedTask([g * 100]), {"params": x, "momentum": m, "v_hat": v_hat * 100}, None)
    upload, kept = algorithm.client_train(ScriptedTask([g]), {"params": x, "momentum": m, "v_hat": v_hat}, None)
    assert kept is None and not algorithm.keeps_client_state
    v_before, _, v, _, _ = recording[-1]
    assert torch.equal(v_before, v_hat)                                  # v_{t,0,i} = v_hat_{t-1}, not 0
    torch.testing.assert_close(v, beta2 * v_hat + (1 - beta2) * g * g, **TIGHT)
    m_new = beta1 * m + (1 - beta1) * g
    v_hat_new = torch.maximum(v_hat, beta2 * v_hat + (1 - beta2) * g * g)
    torch.testing.assert_close(upload.tensors["momentum"], m_new, **TIGHT)
    torch.testing.assert_close(upload.tensors["v_hat"], v_hat_new, **TIGHT)
    torch.testing.assert_close(upload.tensors["params"], x - alpha * m_new / v_hat_new.sqrt(), **TIGHT)


@pytest.mark.parametrize("vhat_agg", ["mean", "max"])
def test_c6_the_server_holds_the_weighted_means_and_the_max_is_order_independent(vhat_agg):
    algorithm = fedlalr(vhat_agg=vhat_agg, agg_weighting="num_samples")
    tasks = {client: QuadraticTask(client) for client in (0, 2, 5)}
    state, uploads = one_round(algorithm, start(algorithm), tasks, weights={0: 1, 2: 3, 5: 6})
    weights = {0: 0.1, 2: 0.3, 5: 0.6}
    for name, held in (("params", state.params), ("momentum", state.momentum)):
        torch.testing.assert_close(held, sum(w * uploads[c].tensors[name] for c, w in weights.items()), **TIGHT)
    rows = [uploads[c].tensors["v_hat"] for c in (0, 2, 5)]
    if vhat_agg == "max":
        pre = start(algorithm)
        for order in itertools.permutations(uploads):
            reordered = {client: uploads[client] for client in order}
            assert torch.equal(algorithm.server_step(pre, reordered, RoundInfo(0, order, 6))[0].v_hat, state.v_hat)
        assert torch.equal(state.v_hat, torch.maximum(torch.maximum(rows[0], rows[1]), rows[2]))
    else:
        torch.testing.assert_close(state.v_hat, sum(w * uploads[c].tensors["v_hat"] for c, w in weights.items()),
                                   **TIGHT)


def test_c8_one_client_one_round_is_paper_amsgrad_and_not_torch_amsgrad():
    alpha, beta1, beta2, eps, steps = 0.05, 0.9, 0.99, 1e-3, 6
    algorithm = fedlalr(lr_local=alpha, beta1=beta1, beta2=beta2, eps=eps)
    task = QuadraticTask(1, steps=steps)
    state, _ = one_round(algorithm, start(algorithm), {1: task})
    expected = reference_amsgrad(lambda k, x: task.loss_and_grad(x, k)[1], torch.zeros(DIM, dtype=torch.float64),
                                 steps, alpha, beta1, beta2, eps)
    torch.testing.assert_close(state.params, expected, **TIGHT)
    x = torch.zeros(DIM, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([x], lr=alpha, betas=(beta1, beta2), eps=eps, amsgrad=True)
    for step in range(steps):
        x.grad = task.loss_and_grad(x.detach(), step)[1]
        optimizer.step()
    assert not torch.allclose(state.params, x.detach(), rtol=1e-6, atol=1e-9)


def rounds_of_one_client(algorithm, per_round_gradients):
    state = start(algorithm, dim=1)
    for round, gradients in enumerate(per_round_gradients):
        state, _ = one_round(algorithm, state, {0: ScriptedTask([[g] for g in gradients])}, round)
    return state


def test_c9_rounds_reset_v_to_v_hat_which_plain_amsgrad_does_not():
    alpha, beta2, eps = 0.1, 0.9, 1e-3
    per_round = [[10.0, 10.0, 0.1, 0.1], [20.0, 20.0, 0.1, 0.1]]
    flat = [g for gradients in per_round for g in gradients]
    state = rounds_of_one_client(fedlalr(lr_local=alpha, beta1=0.0, beta2=beta2, eps=eps), per_round)
    gradient_at = lambda step, x: torch.tensor([flat[step]], dtype=torch.float64)    # noqa: E731
    x0 = torch.zeros(1, dtype=torch.float64)
    with_reset = reference_amsgrad(gradient_at, x0, 8, alpha, 0.0, beta2, eps, reset_every=4)
    plain = reference_amsgrad(gradient_at, x0, 8, alpha, 0.0, beta2, eps)
    torch.testing.assert_close(state.params, with_reset, **TIGHT)
    assert abs(float(with_reset - plain)) > 1e-3


def test_c10_beta2_zero_removes_the_reset():
    alpha, eps = 0.1, 1e-3
    per_round = [[10.0, 10.0, 0.1, 0.1], [20.0, 0.5, 0.1, 3.0], [1.0, 2.0, 3.0, 4.0]]
    flat = [g for gradients in per_round for g in gradients]
    state = rounds_of_one_client(fedlalr(lr_local=alpha, beta1=0.7, beta2=0.0, eps=eps), per_round)
    plain = reference_amsgrad(lambda step, x: torch.tensor([flat[step]], dtype=torch.float64),
                              torch.zeros(1, dtype=torch.float64), 12, alpha, 0.7, 0.0, eps)
    torch.testing.assert_close(state.params, plain, **TIGHT)


class ClippedQuadratic(QuadraticTask):
    """Gradients clipped to [-1, 1], so that |g| <= eps = 10 (C11)."""

    def loss_and_grad(self, params, batch):
        loss, grad = super().loss_and_grad(params, batch)
        return loss, grad.clamp(-1.0, 1.0)


@pytest.mark.parametrize("beta1, restart", [(0.0, False), (0.6, False), (0.6, True)])
def test_c11_eps_dominance_makes_fedlalr_fedavg_with_ema_momentum(beta1, restart):
    alpha, eps, steps = 0.5, 10.0, 3
    algorithm = fedlalr(lr_local=alpha, beta1=beta1, beta2=0.9, eps=eps, restart_momentum=restart)
    state = start(algorithm)
    x, m = state.params.clone(), torch.zeros(DIM, dtype=torch.float64)
    for round in range(4):
        clients = [round % 6, (round + 2) % 6]
        state, _ = one_round(algorithm, state, {c: ClippedQuadratic(c, steps=steps) for c in clients}, round)
        assert torch.equal(state.v_hat, torch.full((DIM,), eps ** 2, dtype=torch.float64))
        models, momenta = [], []
        for client in clients:
            task, y, momentum = ClippedQuadratic(client, steps=steps), x.clone(), torch.zeros_like(m) if restart else m
            for step in range(steps):
                momentum = beta1 * momentum + (1 - beta1) * task.loss_and_grad(y, step)[1]
                y = y - (alpha / eps) * momentum
            models.append(y)
            momenta.append(momentum)
        x, m = sum(models) / 2, sum(momenta) / 2
        torch.testing.assert_close(state.params, x, **TIGHT)
    if beta1 == 0.0:
        sgd = run_rounds(make("fedavg", lr_local=alpha / eps, lr_global=1.0),
                         [[0, 2], [1, 3], [2, 4], [3, 5]], torch.zeros(DIM, dtype=torch.float64),
                         functools.partial(ClippedQuadratic, steps=steps))
        torch.testing.assert_close(sgd.states[-1].params, state.params, **TIGHT)


@pytest.mark.parametrize("vhat_agg", ["mean", "max"])
def test_c12_linear_losses_with_zero_betas_follow_the_closed_form(vhat_agg):
    alpha, steps, eps = 0.1, 3, 1e-3
    c = torch.tensor([[2.0, -0.5], [-1.0, 3.0], [0.5, 1.0]], dtype=torch.float64)
    algorithm = fedlalr(lr_local=alpha, beta1=0.0, beta2=0.0, eps=eps, vhat_agg=vhat_agg)
    state = start(algorithm, dim=2)
    tasks = lambda: {i: ScriptedTask([c[i]] * steps) for i in range(3)}        # noqa: E731
    state, _ = one_round(algorithm, state, tasks())
    torch.testing.assert_close(state.params, -alpha * steps * torch.sign(c).mean(0), **TIGHT)
    synced = (c ** 2).amax(0) if vhat_agg == "max" else (c ** 2).mean(0)
    torch.testing.assert_close(state.v_hat, synced, **TIGHT)
    x1 = state.params
    state, _ = one_round(algorithm, state, tasks(), round=1)
    expected = x1 - alpha * steps * (c / torch.sqrt(torch.maximum(synced, c ** 2))).mean(0)
    torch.testing.assert_close(state.params, expected, **TIGHT)


def test_c13_one_local_step_has_a_closed_form():
    alpha, beta1, beta2 = 0.05, 0.8, 0.95
    algorithm = fedlalr(lr_local=alpha, beta1=beta1, beta2=beta2, eps=1e-2)
    state = start(algorithm)
    x, m, v_hat = state.params.clone(), state.momentum.clone(), state.v_hat.clone()
    for round in range(5):
        tasks = {i: QuadraticTask(i, steps=1) for i in range(4)}
        gradients = [tasks[i].loss_and_grad(x, 0)[1] for i in range(4)]
        state, _ = one_round(algorithm, state, tasks, round)
        rates = [torch.maximum(v_hat, beta2 * v_hat + (1 - beta2) * g * g) for g in gradients]
        x = x - alpha * sum((beta1 * m + (1 - beta1) * g) / r.sqrt() for g, r in zip(gradients, rates)) / 4
        m = sum(beta1 * m + (1 - beta1) * g for g in gradients) / 4
        v_hat = sum(rates) / 4
        torch.testing.assert_close(state.params, x, **TIGHT)
        torch.testing.assert_close(state.v_hat, v_hat, **TIGHT)


def test_c14_identical_clients_equal_one_client_for_both_aggregations():
    single = start(fedlalr())
    runs = {agg: start(fedlalr(vhat_agg=agg)) for agg in ("mean", "max")}
    for round in range(3):
        single, _ = one_round(fedlalr(), single, {0: QuadraticTask(1)}, round)
        for agg in runs:
            runs[agg], _ = one_round(fedlalr(vhat_agg=agg), runs[agg], {i: QuadraticTask(1) for i in range(4)}, round)
    for state in runs.values():
        for name in ("params", "momentum", "v_hat"):
            torch.testing.assert_close(getattr(state, name), getattr(single, name), **TIGHT)


def test_c15_scaling_the_loss_and_eps_together_leaves_the_trajectory_unchanged():
    def trajectory(scale):
        algorithm = fedlalr(eps=1e-2 * scale)
        state = start(algorithm)
        for round in range(3):
            state, _ = one_round(algorithm, state, {i: QuadraticTask(i, scale=scale) for i in range(3)}, round)
        return state

    base, scaled = trajectory(1.0), trajectory(1000.0)
    torch.testing.assert_close(scaled.params, base.params, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(scaled.v_hat, base.v_hat * 1e6, rtol=1e-10, atol=0.0)


def test_c18_round_t_steps_with_alpha_gamma_to_the_t():
    gamma, alpha = 0.9, 0.05
    decayed = fedlalr(lr_local=alpha)
    for round in range(3):
        task = TrainingTask(QuadraticTask(2), steps=3, lr_factor=gamma ** round)
        reference = fedlalr(lr_local=alpha * gamma ** round)
        down = {"params": torch.ones(DIM, dtype=torch.float64), "momentum": torch.zeros(DIM, dtype=torch.float64),
                "v_hat": torch.full((DIM,), 1e-4, dtype=torch.float64)}
        got = decayed.client_train(task, down, None)[0].tensors["params"]
        torch.testing.assert_close(got, reference.client_train(QuadraticTask(2), down, None)[0].tensors["params"],
                                   **TIGHT)


class ZeroLoss(ScriptedTask):
    def __init__(self, steps):
        super().__init__([[0.0] * DIM] * steps)


def test_c19_weight_decay_coupled_enters_the_moments_decoupled_only_shrinks(recording):
    decay, alpha, steps, beta2 = 0.1, 0.05, 4, 0.9
    algorithm = fedlalr(lr_local=alpha, beta1=0.5, beta2=beta2)
    x = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    v_hat = torch.full((DIM,), 1e-4, dtype=torch.float64)
    down = {"params": x, "momentum": torch.zeros(DIM, dtype=torch.float64), "v_hat": v_hat}
    coupled = algorithm.client_train(TrainingTask(ZeroLoss(steps), steps, weight_decay=decay), down, None)[0]
    assert torch.allclose(recording[0][4], decay * x, **TIGHT)               # g = lambda x
    assert (coupled.tensors["momentum"] != 0).all() and (coupled.tensors["v_hat"] > v_hat).all()
    recording.clear()
    decoupled = algorithm.client_train(TrainingTask(ZeroLoss(steps), steps, weight_decay=decay, decoupled=True),
                                       down, None)[0]
    assert torch.equal(decoupled.tensors["momentum"], torch.zeros(DIM, dtype=torch.float64))
    assert torch.equal(decoupled.tensors["v_hat"], v_hat)
    for step, (_, _, v, _, _) in enumerate(recording, start=1):
        torch.testing.assert_close(v, beta2 ** step * v_hat, **TIGHT)
    torch.testing.assert_close(decoupled.tensors["params"], x * (1 - alpha * decay) ** steps, **TIGHT)


# ---- variants ----

def test_c20_restart_momentum_sends_no_momentum_and_equals_alg1_without_momentum(recording):
    algorithm = fedlalr(restart_momentum=True, beta1=0.7)
    state = start(algorithm)
    assert state.momentum is None and set(algorithm.broadcast(state)) == {"params", "v_hat"}
    for round in range(3):
        recording.clear()
        state, uploads = one_round(algorithm, state, {i: QuadraticTask(i) for i in range(3)}, round)
        assert all(set(upload.tensors) == {"params", "v_hat"} for upload in uploads.values())
        assert state.momentum is None
        # The first step's m is (1 - beta1) g: it started at 0.
        for first_step in recording[::3]:
            torch.testing.assert_close(first_step[1], 0.3 * first_step[4], **TIGHT)
    without = {restart: start(fedlalr(restart_momentum=restart, beta1=0.0)) for restart in (False, True)}
    for round in range(3):
        for restart in without:
            without[restart], _ = one_round(fedlalr(restart_momentum=restart, beta1=0.0), without[restart],
                                            {i: QuadraticTask(i) for i in range(3)}, round)
    assert torch.equal(without[True].params, without[False].params)


def test_c21_max_aggregation_dominates_the_mean_from_the_same_state():
    pre = start(fedlalr())
    pre, _ = one_round(fedlalr(), pre, {i: QuadraticTask(i) for i in range(3)})
    tasks = lambda: {i: QuadraticTask(i, scale=1 + i) for i in range(4)}      # noqa: E731
    mean_state, _ = one_round(fedlalr(vhat_agg="mean"), pre, tasks(), round=1)
    max_state, _ = one_round(fedlalr(vhat_agg="max"), pre, tasks(), round=1)
    assert (max_state.v_hat >= mean_state.v_hat).all() and (max_state.v_hat > mean_state.v_hat).any()
    single_mean, _ = one_round(fedlalr(vhat_agg="mean"), pre, {3: QuadraticTask(3)}, round=1)
    single_max, _ = one_round(fedlalr(vhat_agg="max"), pre, {3: QuadraticTask(3)}, round=1)
    assert torch.equal(single_mean.v_hat, single_max.v_hat)


def test_naive_local_amsgrad_synchronises_only_the_model(recording):
    algorithm = fedlalr("local_amsgrad", eps=1e-2)
    state = start(algorithm)
    assert state.momentum is None and state.v_hat is None and set(algorithm.broadcast(state)) == {"params"}
    for round in range(2):
        recording.clear()
        state, uploads = one_round(algorithm, state, {i: QuadraticTask(i) for i in range(3)}, round)
        assert all(set(upload.tensors) == {"params"} for upload in uploads.values())
        assert torch.equal(recording[0][0], torch.full((DIM,), 1e-4, dtype=torch.float64))   # v restarts at eps^2
        torch.testing.assert_close(recording[0][1], 0.1 * recording[0][4], **TIGHT)              # and m at 0


def test_eps_mode_add_alone_adds_eps_to_the_denominator_from_a_zero_v_hat():
    g = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64)
    eps, beta2, alpha = 1e-2, 0.99, 0.1
    state, _ = one_round(fedlalr(eps_mode="add", eps=eps, beta1=0.0, beta2=beta2, lr_local=alpha),
                         start(fedlalr(eps_mode="add", eps=eps)), {0: ScriptedTask([g])})
    torch.testing.assert_close(state.params, -alpha * g / ((1 - beta2) ** 0.5 * g.abs() + eps), **TIGHT)


def test_bias_correction_alone_divides_m_and_v_hat_by_the_rounds_step_count():
    g = [torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64), torch.tensor([1.0, 1.0, -1.0, 0.0],
                                                                                   dtype=torch.float64)]
    eps, beta1, beta2, alpha = 1e-2, 0.9, 0.99, 0.1
    algorithm = fedlalr(bias_correction=True, eps=eps, beta1=beta1, beta2=beta2, lr_local=alpha)
    state, _ = one_round(algorithm, start(algorithm), {0: ScriptedTask(g)})
    x, m, v = torch.zeros(DIM, dtype=torch.float64), torch.zeros(DIM, dtype=torch.float64), \
        torch.full((DIM,), eps ** 2, dtype=torch.float64)
    v_hat = v.clone()
    for k, grad in enumerate(g, start=1):
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad ** 2
        v_hat = torch.maximum(v_hat, v)
        x = x - alpha * (m / (1 - beta1 ** k)) / torch.sqrt(v_hat / (1 - beta2 ** k))
    torch.testing.assert_close(state.params, x, **TIGHT)


def test_eps_mode_add_and_bias_correction_are_the_ablations_they_name():
    g = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64)
    eps, beta1, beta2, alpha = 1e-2, 0.9, 0.99, 0.1
    algorithm = fedlalr(eps_mode="add", bias_correction=True, eps=eps, beta1=beta1, beta2=beta2, lr_local=alpha)
    state = start(algorithm)
    assert torch.equal(state.v_hat, torch.zeros(DIM, dtype=torch.float64))
    state, _ = one_round(algorithm, state, {0: ScriptedTask([g])})
    # One bias-corrected step from zero moments is Adam's first step: g / (|g| + eps).
    torch.testing.assert_close(state.params, -alpha * g / (g.abs() + eps), **TIGHT)


def test_the_uploads_are_copies_of_the_resident_model_and_three_vectors_long():
    algorithm = fedlalr()
    task = QuadraticTask(0)
    upload = algorithm.client_train(task, algorithm.broadcast(start(algorithm)), None)[0]
    sent = upload.tensors["params"].clone()
    task.params.add_(1.0)               # the worker's next client overwrites the resident model in place
    assert torch.equal(upload.tensors["params"], sent)
    assert upload.nbytes == 3 * DIM * 8


def test_e6_trace_logs_each_clients_v_hat_norm_after_every_step(recording):
    algorithm = fedlalr(trace_v_hat=True)
    state, uploads = one_round(algorithm, start(algorithm), {2: QuadraticTask(2, steps=4), 5: QuadraticTask(5)})
    _, metrics = algorithm.server_step(start(algorithm), uploads, RoundInfo(0, (2, 5), 6))
    assert sorted(metrics["v_hat_sq_norms"]) == ["2", "5"]
    norms = metrics["v_hat_sq_norms"]["2"]
    assert norms == [float(step[3].square().sum()) for step in recording[:4]]
    assert norms == sorted(norms)                               # S2: non-decreasing within the round
