"""FedDyn: rounds against a float64 recursion written from Acar et al.'s Algorithm 1, the server's
h as -alpha/N times every model change so far, the alpha -> 0 limit, engines, resume and the
memory check."""
import pytest
import torch

from tests.algorithm_checks import assert_engines_agree, assert_memory_check_counts_client_state, assert_resume_agrees
from tests.fakes import DIM, NUM_CLIENTS, SCHEDULE, client, make, run_rounds


def reference(alpha, lr=0.1, steps=3):
    """(x_t, h_t) after every round, and every model change, in float64."""
    x, h, client_h = torch.zeros(DIM, dtype=torch.float64), torch.zeros(DIM, dtype=torch.float64), {}
    rounds, changes = [], []
    for sampled in SCHEDULE:
        round_changes = {}
        for i in sorted(sampled):
            task, w = client(i), x.clone()
            h_i = client_h.get(i, torch.zeros(DIM, dtype=torch.float64))
            for _ in range(steps):
                A, b = (t.double() for t in task.next_batch())
                gradient = A.T @ (A @ w - b) / len(b) - h_i + alpha * (w - x)
                w = w - lr * gradient
            round_changes[i] = w - x
            client_h[i] = h_i - alpha * round_changes[i]
        total = torch.stack(list(round_changes.values())).sum(0)
        h = h - alpha / NUM_CLIENTS * total
        x = x + total / len(sampled) - h / alpha
        rounds.append((x, h))
        changes.append(round_changes)
    return rounds, changes


@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.0])
def test_rounds_follow_the_papers_recursion(alpha):
    run = run_rounds(make("feddyn", alpha=alpha))
    expected, changes = reference(alpha)
    for state, (x, h) in zip(run.states, expected):
        torch.testing.assert_close(state.params.double(), x, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state.h.double(), h, rtol=1e-5, atol=1e-7)
    for i, state in run.client_states.items():          # h_i = -alpha times the sum of i's model changes
        own = sum(round_changes[i] for round_changes in changes if i in round_changes)
        torch.testing.assert_close(state.h.double(), -alpha * own, rtol=1e-5, atol=1e-7)


def test_the_server_h_is_minus_alpha_over_n_times_every_model_change_so_far():
    alpha = 0.1
    run = run_rounds(make("feddyn", alpha=alpha))
    starts = [torch.zeros(DIM)] + [state.params for state in run.states[:-1]]
    changes = []
    for state, start, models in zip(run.states, starts, run.client_models):
        changes += [model - start for model in models.values()]
        torch.testing.assert_close(state.h, -alpha / NUM_CLIENTS * torch.stack(changes).sum(0), rtol=1e-5, atol=1e-7)


def test_as_alpha_goes_to_zero_clients_run_fedavg_and_the_server_adds_the_average_of_all_changes():
    """h_i -> 0 and the proximal pull vanishes; h / alpha = -(1/N) sum of all changes stays."""
    run = run_rounds(make("feddyn", alpha=1e-6))
    fedavg = run_rounds(make("fedavg", lr_global=1.0))
    _, changes = reference(1e-6)
    x = torch.zeros(DIM, dtype=torch.float64)
    every_change = torch.zeros(DIM, dtype=torch.float64)
    for state, round_changes in zip(run.states, changes):
        total = torch.stack(list(round_changes.values())).sum(0)
        every_change += total
        x = x + total / len(round_changes) + every_change / NUM_CLIENTS
        torch.testing.assert_close(state.params.double(), x, rtol=1e-5, atol=1e-5)
    first_round = zip(run.client_models[0].values(), fedavg.client_models[0].values())
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in first_round)


@pytest.mark.slow
def test_local_and_ray_engines_are_bitwise_identical(tmp_path, ray_cluster):
    reference_run = assert_engines_agree(tmp_path, ["algorithm.name=feddyn"])
    assert reference_run.summary["client_state_bytes"] > 0


def test_resume_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch):
    assert_resume_agrees(tmp_path, monkeypatch, ["algorithm.name=feddyn", "algorithm.alpha=0.1"])


def test_the_memory_check_counts_every_clients_gradient_state(monkeypatch):
    assert_memory_check_counts_client_state(monkeypatch, ["algorithm.name=feddyn"])
