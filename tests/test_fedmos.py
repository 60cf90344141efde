"""FedMoS and STEM against specs/fedmos.md §9 (T1-T11, T25) on float64 least-squares clients."""
import numpy as np
import pytest
import torch

from rayfed.algorithms.base import RoundInfo
from rayfed.algorithms.fedmos import FedMoS
from rayfed.algorithms.stem import STEM
from tests.fakes import client, make

F64 = torch.float64


class StormTask:
    """f_i(x) = 1/2 mean_r (a_r . x - b_r)^2 in float64, with independent draws from `draws` and a
    record of every gradient it handed out: (kind, point, gradient)."""

    def __init__(self, client_id=0, dim=3, num_samples=12, batch_size=3, steps=4, draw_seed=0, offset=None):
        generator = torch.Generator().manual_seed(100 + client_id)
        self.A = torch.randn(num_samples, dim, generator=generator, dtype=F64)
        self.b = torch.randn(num_samples, generator=generator, dtype=F64) + (client_id if offset is None else offset)
        self.num_samples, self.batch_size, self.steps, self.lr_factor = num_samples, batch_size, steps, 1.0
        self.draws = torch.Generator().manual_seed(draw_seed)
        self.position = 0
        self.params = torch.zeros(dim, dtype=F64)
        self.calls = []

    def start_from(self, params):
        self.params = params.clone()
        return self.params

    def rows_grad(self, params, rows):
        A, b = self.A[rows], self.b[rows]
        residual = A @ params - b
        return (0.5 * residual.pow(2).mean()).detach(), A.T @ residual / len(rows)

    def exact_grad(self, params):
        return self.rows_grad(params, torch.arange(self.num_samples))[1]

    def next_batch(self):
        rows = torch.arange(self.position, self.position + self.batch_size) % self.num_samples
        self.position += self.batch_size
        return rows

    def draw_batch(self, size=None):
        return torch.randperm(self.num_samples, generator=self.draws)[:size or self.batch_size]

    def loss_and_grad(self, params, rows):
        loss, grad = self.rows_grad(params, rows)
        self.calls.append(("minibatch", params.clone(), grad.clone()))
        return loss, grad

    def paired_loss_and_grad(self, current, previous, rows):
        loss, grad = self.rows_grad(current, rows)
        grad_at_previous = self.rows_grad(previous, rows)[1]
        self.calls.append(("paired", current.clone(), grad.clone(), previous.clone(), grad_at_previous.clone()))
        return loss, grad, grad_at_previous

    def full_loss_and_grad(self, params):
        loss, grad = self.rows_grad(params, torch.arange(self.num_samples))
        self.calls.append(("full", params.clone(), grad.clone()))
        return loss, grad

    def decay(self, params, lr):
        pass


def fedmos(lr=0.1, **hyper):
    return make("fedmos", lr_local=lr, **hyper)


def client_iterates(algorithm, task, x0):
    """The local iterates x_0 .. x_I of one client round: x_0, the points its corrections were taken
    at, and x_0 + Delta."""
    upload, _ = algorithm.client_train(task, {"params": x0}, None)
    points = [x0] + [call[1] for call in task.calls if call[0] == "paired"]
    return points + [x0 + upload.tensors["model_change"]], upload


def directions_taken(iterates, x0, lr, mu):
    """d_tau as the update x_{tau+1} = (1 - mu) x_tau + mu x0 - lr d_tau implies it."""
    return [((1 - mu) * x + mu * x0 - following) / lr for x, following in zip(iterates, iterates[1:])]


# ---- T1, T2: reductions to FedAvg and FedProx ----

def run_with_clients(algorithm, rounds=4, sampled=(0, 2, 3), steps=4):
    state = algorithm.server_init(torch.zeros(5), 6)
    for round in range(rounds):
        down = algorithm.broadcast(state)
        uploads = {i: algorithm.client_train(client(i, steps=steps), down, None)[0] for i in sampled}
        state, _ = algorithm.server_step(state, uploads, RoundInfo(round, sampled, 6))
    return algorithm.global_params(state)


def test_t1_fedmos_with_a_1_no_prox_no_momentum_and_a_minibatch_start_is_fedavg():
    reduced = fedmos(0.05, a=1.0, mu=0.0, beta1=0.0, init_grad="minibatch", minibatches="shuffled")
    torch.testing.assert_close(run_with_clients(reduced), run_with_clients(make("fedavg", lr_local=0.05, lr_global=1.0)),
                               rtol=1e-6, atol=1e-7)


def test_t2_fedmos_with_mu_eta_mu_prox_is_fedprox():
    mu_prox = 0.4
    reduced = fedmos(0.05, a=1.0, mu=0.05 * mu_prox, beta1=0.0, init_grad="minibatch", minibatches="shuffled")
    fedprox = make("fedprox", lr_local=0.05, lr_global=1.0, mu=mu_prox)
    torch.testing.assert_close(run_with_clients(reduced), run_with_clients(fedprox), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(run_with_clients(reduced), run_with_clients(make("fedavg", lr_local=0.05, lr_global=1.0)))


# ---- T3, T6, T9: the client's recursion ----

@pytest.mark.parametrize("init_grad", ["full", "minibatch"])
def test_t3_the_upload_is_the_unrolled_sum_of_the_recursions_directions(init_grad):
    lr, a, mu = 0.2, 0.3, 0.15
    algorithm = fedmos(lr, a=a, mu=mu, init_grad=init_grad)
    task = StormTask(steps=5)
    x0 = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    upload, _ = algorithm.client_train(task, {"params": x0}, None)
    # d from the gradients the task handed out, by Eq. (3), independently of the algorithm's loop
    directions = [task.calls[0][2]]
    for call in task.calls[1:]:
        _, _, grad, _, grad_at_previous = call
        directions.append(grad + (1 - a) * (directions[-1] - grad_at_previous))
    assert len(directions) == task.steps
    unrolled = -lr * sum((1 - mu) ** (task.steps - 1 - tau) * d for tau, d in enumerate(directions))
    torch.testing.assert_close(upload.tensors["model_change"], unrolled, rtol=0, atol=1e-12 * unrolled.norm().item())


@pytest.mark.parametrize("a", [0.0, 0.3, 1.0])
def test_t6_full_batches_make_every_direction_the_exact_local_gradient(a):
    lr, mu = 0.1, 0.05
    task = StormTask(batch_size=12, steps=5)                       # every minibatch is the whole dataset
    x0 = torch.tensor([1.0, 0.0, -1.0], dtype=F64)
    iterates, _ = client_iterates(fedmos(lr, a=a, mu=mu), task, x0)
    for x, d in zip(iterates, directions_taken(iterates, x0, lr, mu)):
        torch.testing.assert_close(d, task.exact_grad(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("init_grad, expected", [("full", {"full": 1, "paired": 3}),
                                                  ("minibatch", {"minibatch": 1, "paired": 3})])
def test_t9_a_round_costs_one_start_and_i_minus_1_paired_evaluations(init_grad, expected):
    task = StormTask(steps=4)
    fedmos(init_grad=init_grad).client_train(task, {"params": torch.zeros(3, dtype=F64)}, None)
    kinds = [call[0] for call in task.calls]
    assert {kind: kinds.count(kind) for kind in set(kinds)} == expected      # paired = 2 minibatch gradients
    for call in task.calls[1:]:
        assert call[0] == "paired"


def test_the_reference_code_estimator_is_sgd_plus_a_decaying_copy_of_the_first_gradient():
    """§2.6: d_tau = g(x_tau; B_tau) + (1 - a)^tau g_0, one gradient per step."""
    lr, a = 0.1, 0.3
    task = StormTask(steps=5)
    x0 = torch.tensor([0.3, 0.2, 0.1], dtype=F64)
    upload, _ = fedmos(lr, a=a, mu=0.0, init_grad="minibatch", client_estimator="reference_code").client_train(
        task, {"params": x0}, None)
    assert [call[0] for call in task.calls] == ["minibatch"] * 5
    first = task.calls[0][2]
    points = [call[1] for call in task.calls] + [x0 + upload.tensors["model_change"]]
    for tau, (x, following, call) in enumerate(zip(points, points[1:], task.calls)):
        expected = call[2] + ((1 - a) ** tau * first if tau else 0)
        torch.testing.assert_close((x - following) / lr, expected, rtol=0, atol=1e-12)


# ---- T7: unbiasedness of the estimator (Lemma 8) ----

def estimator_errors(init_grad, estimator, repetitions=10_000, steps=4, lr=0.1, a=0.3):
    """e_tau = d_tau - grad f(x_tau) of `repetitions` independent client rounds: (repetitions, steps, dim)."""
    algorithm = fedmos(lr, a=a, mu=0.0, init_grad=init_grad, client_estimator=estimator)
    x0 = torch.tensor([0.5, -0.5, 1.0], dtype=F64)
    errors = np.empty((repetitions, steps, 3))
    for repetition in range(repetitions):
        task = StormTask(steps=steps, batch_size=3, draw_seed=repetition)
        upload, _ = algorithm.client_train(task, {"params": x0}, None)
        iterates = [x0, *(call[1] for call in task.calls[1:]), x0 + upload.tensors["model_change"]]
        for tau, (x, following) in enumerate(zip(iterates, iterates[1:])):
            errors[repetition, tau] = ((x - following) / lr - task.exact_grad(x)).numpy()
    return errors


def largest_z_score(errors):
    mean = errors.mean(axis=0)
    standard_error = errors.std(axis=0, ddof=1) / np.sqrt(len(errors))
    # A full-gradient start has no error to speak of: its rounding must not count as bias.
    return np.max(np.abs(mean) / np.maximum(standard_error, 1e-12), axis=-1)      # per step


@pytest.mark.parametrize("init_grad", ["full", "minibatch"])
def test_t7_the_storm_estimator_is_unbiased_at_every_step(init_grad):
    z = largest_z_score(estimator_errors(init_grad, "storm_paper"))
    assert np.all(z <= 4.0), z


def test_t7_negative_control_the_reference_code_estimator_is_biased_after_the_first_step():
    z = largest_z_score(estimator_errors("minibatch", "reference_code"))
    assert z[0] <= 4.0 and np.all(z[1:] > 4.0), z


# ---- T4, T5, T11: the server ----

def server_rounds(algorithm, uploads_per_round):
    state = algorithm.server_init(torch.tensor([1.0, -2.0, 0.5], dtype=F64), 4)
    trajectory = [state.params]
    for round, (uploads, weights) in enumerate(uploads_per_round):
        state, _ = algorithm.server_step(state, uploads, RoundInfo(round, tuple(uploads), 4, weights))
        trajectory.append(state.params)
    return trajectory


def fake_uploads(rounds=6, seed=0):
    from rayfed.algorithms.base import Upload
    generator = torch.Generator().manual_seed(seed)
    per_round = []
    for _ in range(rounds):
        uploads = {i: Upload({"model_change": torch.randn(3, generator=generator, dtype=F64)}, 10) for i in (0, 2, 3)}
        per_round.append((uploads, {0: 0.5, 2: 0.25, 3: 0.25}))
    return per_round


def aggregate(uploads, weights):
    return sum(weights[i] * upload.tensors["model_change"] for i, upload in uploads.items())


def test_t4_the_server_is_heavy_ball_on_the_aggregate():
    beta = 0.8
    rounds = fake_uploads()
    x = server_rounds(FedMoS(0.05, 1.0, a=0.1, mu=0.0, beta1=beta, local_steps=5), rounds)
    torch.testing.assert_close(x[1] - x[0], aggregate(*rounds[0]), rtol=0, atol=1e-12)
    for t in range(1, len(rounds)):
        torch.testing.assert_close(x[t + 1] - x[t], aggregate(*rounds[t]) + beta * (x[t] - x[t - 1]),
                                   rtol=0, atol=1e-12)


def test_t5_the_normalisation_constant_leaves_the_trajectory_unchanged():
    rounds = fake_uploads()
    reference = server_rounds(FedMoS(0.05, 1.0, a=0.1, mu=0.0, beta1=0.8, local_steps=5), rounds)
    for lr, local_steps in ((0.5, 1), (0.003, 40)):
        other = server_rounds(FedMoS(lr, 1.0, a=0.1, mu=0.0, beta1=0.8, local_steps=local_steps), rounds)
        for x, y in zip(reference, other):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def test_the_reference_codes_round_0_leaves_the_momentum_at_zero():
    rounds = fake_uploads()
    skip = FedMoS(0.05, 1.0, a=0.1, mu=0.0, beta1=0.8, local_steps=5, server_momentum_skip_round0=True)
    state = skip.server_init(torch.zeros(3, dtype=F64), 4)
    state, _ = skip.server_step(state, rounds[0][0], RoundInfo(0, (0, 2, 3), 4, rounds[0][1]))
    assert torch.equal(state.optimizer.momentum, torch.zeros(3, dtype=F64))
    torch.testing.assert_close(state.params, aggregate(*rounds[0]))
    second = state.params
    state, _ = skip.server_step(state, rounds[1][0], RoundInfo(1, (0, 2, 3), 4, rounds[1][1]))
    torch.testing.assert_close(state.params - second, aggregate(*rounds[1]), rtol=0, atol=1e-12)     # beta u^0 = 0


def test_t11_a_client_drawn_twice_trains_once_and_counts_twice():
    from rayfed.selection.selectors import _first_and_counts
    draws = np.array([3, 0, 3, 2])                                  # M = 4 draws, client 3 twice
    clients, counts = _first_and_counts(draws)
    weights = dict(zip(clients.tolist(), (counts / len(draws)).tolist()))
    algorithm = fedmos(0.05, beta1=0.0)
    down = {"params": torch.zeros(5)}
    uploads = {i: algorithm.client_train(client(i), down, None)[0] for i in sorted(weights)}
    state, _ = algorithm.server_step(algorithm.server_init(torch.zeros(5), 6), uploads,
                                     RoundInfo(0, tuple(clients.tolist()), 6, weights))
    per_draw = sum(uploads[int(i)].tensors["model_change"] for i in draws) / len(draws)
    torch.testing.assert_close(state.params, per_draw)
    assert weights == {3: 0.5, 0: 0.25, 2: 0.25}


# ---- STEM ----

def test_stem_starts_from_the_full_gradient_then_from_the_servers_momentum_and_averages_both():
    lr, a = 0.1, 0.4
    stem = STEM(lr, 1.0, a=a)
    state = stem.server_init(torch.tensor([0.2, 0.1, -0.3], dtype=F64), 4)
    assert set(stem.broadcast(state)) == {"params"}
    tasks = {i: StormTask(client_id=i, batch_size=12, steps=3) for i in (0, 1)}      # full batches: d is exact
    uploads = {i: stem.client_train(task, stem.broadcast(state), None)[0] for i, task in tasks.items()}
    for i, task in tasks.items():
        assert task.calls[0][0] == "full" and [c[0] for c in task.calls[1:]] == ["paired"] * 3      # I corrections
        end = state.params + uploads[i].tensors["model_change"]
        torch.testing.assert_close(uploads[i].tensors["momentum"], task.exact_grad(end), rtol=0, atol=1e-10)
    weights = {0: 0.7, 1: 0.3}
    new, _ = stem.server_step(state, uploads, RoundInfo(0, (0, 1), 4, weights))
    torch.testing.assert_close(new.momentum, 0.7 * uploads[0].tensors["momentum"] + 0.3 * uploads[1].tensors["momentum"])
    torch.testing.assert_close(new.params, state.params + aggregate(uploads, weights))
    down = stem.broadcast(new)
    assert set(down) == {"params", "momentum"} and stem.upload_size(10) == 20
    task = StormTask(client_id=2, steps=3)
    upload, _ = stem.client_train(task, down, None)
    assert [c[0] for c in task.calls] == ["paired"] * 3                             # no full gradient any more
    first_step = task.calls[0][3] - task.calls[0][1]
    torch.testing.assert_close(first_step, lr * down["momentum"], rtol=0, atol=1e-12)


def test_stem_normalised_momentum_weights_sum_to_one():
    from rayfed.algorithms.base import Upload
    stem = STEM(0.1, 1.0, a=0.4, momentum_weights="normalized")
    state = stem.server_init(torch.zeros(2, dtype=F64), 4)
    uploads = {i: Upload({"model_change": torch.zeros(2, dtype=F64), "momentum": torch.full((2,), float(i), dtype=F64)}, 1)
               for i in (1, 3)}
    new, _ = stem.server_step(state, uploads, RoundInfo(0, (1, 3), 4, {1: 0.5, 3: 1.5}))      # ucs: sum 2
    torch.testing.assert_close(new.momentum, torch.full((2,), 0.25 * 1 + 0.75 * 3, dtype=F64))


# ---- T25: end to end on a heterogeneous least-squares federation ----

def global_loss(tasks, x, p):
    return sum(p_i * task.rows_grad(x, torch.arange(task.num_samples))[0] for task, p_i in zip(tasks, p))


@pytest.mark.parametrize("selector", ["ucs", "acs"])
def test_t25_fedmos_lowers_the_global_loss_under_sampling(selector):
    from rayfed.selection import select
    counts = np.array([8 + (i * 7) % 23 for i in range(50)])
    p = counts / counts.sum()
    tasks = [StormTask(client_id=i, num_samples=int(counts[i]), batch_size=4, steps=5, draw_seed=i, offset=(i % 5) * 0.3)
             for i in range(50)]
    A = torch.cat([task.A for task in tasks])
    b = torch.cat([task.b for task in tasks])
    best = global_loss(tasks, torch.linalg.lstsq(A, b[:, None]).solution[:, 0], p)    # f* of sum_i p_i f_i
    algorithm = fedmos(0.05, a=0.3, mu=0.01, beta1=0.5)
    state = algorithm.server_init(torch.tensor([3.0, -3.0, 3.0], dtype=F64), 50)
    start = global_loss(tasks, state.params, p) - best
    rng = np.random.default_rng(0)
    for round in range(30):
        chosen = select(selector, np.arange(50), counts, 5, rng)
        weights = dict(zip(chosen.clients.tolist(), chosen.weights.tolist()))
        uploads = {i: algorithm.client_train(tasks[i], algorithm.broadcast(state), None)[0] for i in sorted(weights)}
        state, _ = algorithm.server_step(state, uploads, RoundInfo(round, tuple(weights), 50, weights))
    assert global_loss(tasks, state.params, p) - best < 0.1 * start


def test_t25_full_participation_with_a_1_no_prox_no_momentum_is_weighted_fedavg():
    counts = [6, 9, 12, 15]
    p = np.array(counts) / sum(counts)
    weights = dict(enumerate(p.tolist()))
    algorithm = fedmos(0.05, a=1.0, mu=0.0, beta1=0.0, init_grad="minibatch")
    state = algorithm.server_init(torch.zeros(3, dtype=F64), 4)
    x = torch.zeros(3, dtype=F64)
    for round in range(5):
        uploads = {}
        hand_written = torch.zeros(3, dtype=F64)
        for i, count in enumerate(counts):
            ours = StormTask(client_id=i, num_samples=count, steps=3, draw_seed=10 * round + i)
            theirs = StormTask(client_id=i, num_samples=count, steps=3, draw_seed=10 * round + i)
            uploads[i] = algorithm.client_train(ours, algorithm.broadcast(state), None)[0]
            y = x.clone()
            for _ in range(3):
                y = y - 0.05 * theirs.rows_grad(y, theirs.draw_batch())[1]
            hand_written += weights[i] * (y - x)
        state, _ = algorithm.server_step(state, uploads, RoundInfo(round, (0, 1, 2, 3), 4, weights))
        x = x + hand_written
        torch.testing.assert_close(state.params, x, rtol=0, atol=1e-12)


# ---- T8, T10 and the full gradient on the worker's real tasks ----

def dropout_task(num_samples=40, batch_size=8):
    from rayfed.engine.worker import ClientTask
    from rayfed.models import FlatModel, build_model
    torch.manual_seed(0)
    model = FlatModel(build_model("cifar_cnn_ref", (3, 32, 32), 10))
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(num_samples, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (num_samples,), generator=generator)
    return ClientTask(model, images, labels, torch.arange(num_samples), batch_size, torch.Generator().manual_seed(2))


def test_t8_both_passes_of_a_step_see_the_same_batch_and_the_same_dropout_masks():
    task = dropout_task()
    params = task.start_from(task.model.params.clone())
    batch = task.draw_batch()
    torch.manual_seed(5)
    _, grad, grad_at_previous = task.paired_loss_and_grad(params, params.clone(), batch)
    assert torch.equal(grad, grad_at_previous)
    after_pair = torch.rand(1)
    torch.manual_seed(5)
    first = task.loss_and_grad(params, batch)[1].clone()
    assert torch.equal(torch.rand(1), after_pair)        # the pair leaves the stream where one pass does
    assert not torch.equal(task.loss_and_grad(params, batch)[1], first)      # dropout is on: masks differ per pass


def test_the_full_gradient_is_the_mean_over_every_sample_in_chunks(monkeypatch):
    import rayfed.engine.worker as worker
    task = dropout_task(num_samples=10)
    task.model.module.eval()                             # no dropout: chunked and whole must agree
    params = task.start_from(task.model.params.clone())
    loss, whole = task.loss_and_grad(params, (task.train_x, task.train_y))
    whole = whole.clone()
    monkeypatch.setattr(worker, "FULL_GRADIENT_CHUNK", 3)   # chunks of 3, 3, 3, 1
    chunked_loss, chunked = task.full_loss_and_grad(params)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-7)
    assert float(chunked_loss) == pytest.approx(float(loss), rel=1e-6)


def test_t10_a_clients_round_is_the_same_wherever_and_whenever_it_trains():
    import rayfed
    from rayfed.api import load_data
    from rayfed.engine.messages import Broadcast
    from rayfed.engine.worker import ClientWorker
    config = rayfed.load_config(None, ["data.num_clients=8", "train.clients_per_round=4", "model.name=logreg", "algorithm.name=fedmos",
                                       "train.batch_size=4"])
    dataset, partition = load_data(config)
    workers = [ClientWorker(config, (dataset.train_x, dataset.train_y), partition, dataset.input_shape,
                            dataset.num_classes, index, 2) for index in range(2)]
    down = Broadcast({"params": workers[0].model.params.clone()}, workers[0].model.buffers.clone())
    fresh = workers[0].train(5, down, [3], 0.0).unpack()[0].upload.tensors["model_change"]
    for round in range(5):
        workers[1].train(round, down, [3, 4], 0.0)
    again = workers[1].train(5, down, [3], 0.0).unpack()[0].upload.tensors["model_change"]
    assert torch.equal(fresh, again)
    assert not torch.equal(fresh, workers[1].train(6, down, [3], 0.0).unpack()[0].upload.tensors["model_change"])


# ---- CACS's warm-up (§3.7) ----

@pytest.mark.parametrize("continue_from_warmup", [False, True])
def test_the_warmup_trains_every_client_on_a_copy_and_training_restarts_from_x0(continue_from_warmup):
    from tests.test_server import fake_results, make_server
    _, server = make_server("algorithm.name=fedavg", "selection.selector=cacs", "selection.cacs_warmup_rounds=2",
                            "selection.cacs_clusters=3",
                            f"selection.cacs_continue_from_warmup={str(continue_from_warmup).lower()}")
    initial = server.global_params().clone()
    clients, rounds = server.begin_warmup()
    assert clients == list(range(20)) and rounds == 2
    for round in range(rounds):
        server.warmup_step(round, fake_results(server, clients, lambda c, b: torch.zeros(b)))
    warmed = server.global_params().clone()
    # fedavg with lr_global 1 moves by -sum_i p_i * (update of client i = its id); sizes are all equal
    torch.testing.assert_close(warmed - initial, torch.full_like(initial, -2 * np.mean(clients)))
    d = server.model.num_params
    gradients = torch.zeros(20, d)
    gradients[np.arange(20), np.arange(20) % 3] = 1.0               # three directions
    report = server.finish_warmup((list(range(20)), gradients))
    assert torch.equal(server.global_params(), warmed if continue_from_warmup else initial)
    assert report["client_rounds"] == 40 and sum(report["cluster_sizes"]) == 20 and report["clusters"] == 3
    assert len(set(zip(np.arange(20) % 3, server.sampler.client_order.labels))) == 3      # the three directions found
    assert not server.sampler.needs_warmup() and ("selection_warmup", {}) not in server.extensions()
    b = server.buffers.numel()
    assert report["bytes_up"] == 2 * 20 * 4 * (d + b) + 20 * 4 * d        # 2 rounds of updates, then the gradients


def test_a_warmup_begun_again_starts_from_the_same_model():
    from tests.test_server import fake_results, make_server
    _, server = make_server("algorithm.name=fedavg", "selection.selector=cacs", "selection.cacs_warmup_rounds=1")
    initial = server.global_params().clone()
    clients, _ = server.begin_warmup()
    server.warmup_step(0, fake_results(server, clients, lambda c, b: torch.zeros(b)))
    snapshot = server.snapshot()                                     # a checkpoint taken now holds x^0
    assert torch.equal(snapshot["state"].params, initial) and snapshot["client_order"] is None
    server.begin_warmup()                                            # a worker died: start over
    assert torch.equal(server.global_params(), initial)


def test_a_cacs_run_reports_its_warmup_apart_from_its_rounds(tmp_path):
    import rayfed
    overrides = ["engine.backend=local", "data.num_clients=12", "train.clients_per_round=4", "train.rounds=3",
                 "train.eval_every=3", "model.name=logreg", "algorithm.name=fedmos", "algorithm.lr_local=0.05",
                 "selection.selector=cacs"]
    result = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "run", progress=False)
    warmup = result.summary["selection_warmup"]
    assert warmup["rounds"] == 4 and warmup["client_rounds"] == 48 and len(warmup["train_loss"]) == 4
    assert warmup["clusters"] <= 4 and sum(warmup["cluster_sizes"]) == 12
    assert len(result.history) == 3
    assert sum(m["bytes_up"] for m in result.history) < warmup["bytes_up"]


# ---- T26: rounds to target ----

def test_t26_rounds_to_target_is_the_first_crossing_one_based_or_none():
    from rayfed.report.stats import first_crossing, rounds_to_target
    loss = [{"round": r, "global_train_loss": v} for r, v in zip(range(1, 7), [2.0, 1.5, 0.41, 0.4, 0.2, 0.5])]
    assert rounds_to_target(loss, "global_train_loss", 0.4, below=True) == 4          # <= target, 1-based
    assert rounds_to_target(loss, "global_train_loss", 0.1, below=True) is None
    accuracy = [{"round": 1}, {"round": 2, "test_accuracy": 0.5}, {"round": 3}, {"round": 4, "test_accuracy": 0.95}]
    assert rounds_to_target(accuracy, "test_accuracy", 0.95) == 4                      # only evaluated rounds count
    assert rounds_to_target(accuracy, "test_accuracy", 0.5) == 2
    assert first_crossing([float("nan"), 0.3, 0.7], 0.6) == 2 and first_crossing([], 0.1) is None


# ---- §7.3 preprocessing and §7.5's training loss ----

def test_half_normalisation_maps_cifar_pixels_to_minus_one_one(cifar_lenet):
    import rayfed
    from rayfed.api import load_data
    channel, _ = load_data(rayfed.load_config(None, cifar_lenet))
    half, _ = load_data(rayfed.load_config(None, cifar_lenet + ["data.normalize=half"]))
    stds = np.array([0.2023, 0.1994, 0.2010])[None, :, None, None]
    means = np.array([0.4914, 0.4822, 0.4465])[None, :, None, None]
    pixels = channel.train_x * stds + means                              # back to x / 255
    np.testing.assert_allclose(half.train_x, (pixels - 0.5) / 0.5, atol=1e-5)
    assert half.train_x.min() >= -1 - 1e-6 and half.train_x.max() <= 1 + 1e-6
    with pytest.raises(rayfed.ConfigError, match="data.normalize=half applies to the torchvision image datasets"):
        rayfed.load_config(None, ["data.dataset=digits", "data.normalize=half"])


def test_the_global_training_loss_is_the_global_models_loss_on_every_clients_samples(tmp_path):
    import rayfed
    from rayfed.api import load_data
    from rayfed.models import FlatModel, build_model
    overrides = ["engine.backend=local", "data.dataset=digits", "data.partition=fedmos", "data.num_clients=20",
                 "train.clients_per_round=4", "train.rounds=3", "train.eval_every=3", "model.name=logreg",
                 "algorithm.name=fedmos", "algorithm.lr_local=0.05", "train.eval_train_loss=true"]
    config = rayfed.load_config(None, overrides)
    result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    dataset, partition = load_data(config)
    rows = np.concatenate([partition.client(i) for i in range(20)])
    model = FlatModel(build_model("logreg", dataset.input_shape, dataset.num_classes))
    model.params.copy_(result.params)
    loss, accuracy = model.evaluate(torch.from_numpy(dataset.train_x[rows]), torch.from_numpy(dataset.train_y[rows]))
    last = result.history[-1]
    assert last["global_train_loss"] == pytest.approx(loss, rel=1e-6)
    assert last["global_train_accuracy"] == accuracy
    assert "global_train_loss" not in result.history[0]                 # only at evaluations
