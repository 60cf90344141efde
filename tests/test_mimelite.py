"""MimeLite with SGD momentum: rounds against a float64 recursion written from Karimireddy et al.'s
Algorithm 1, beta = 0 is FedAvg bit for bit, its 2x traffic, engines and resume."""
import pytest
import torch

from tests.algorithm_checks import assert_engines_agree, assert_resume_agrees, assert_same_params
from tests.fakes import DIM, SCHEDULE, client, make, run_rounds


@pytest.mark.parametrize("beta", [0.3, 0.9])
def test_rounds_follow_the_papers_recursion(beta):
    lr_local, lr_global = 0.1, 0.7
    run = run_rounds(make("mimelite", beta1=beta, lr_local=lr_local, lr_global=lr_global))
    x, s = torch.zeros(DIM, dtype=torch.float64), torch.zeros(DIM, dtype=torch.float64)
    for state, sampled in zip(run.states, SCHEDULE):
        gradients, changes = [], []
        for i in sorted(sampled):
            task = client(i)
            A, b = task.A.double(), task.b.double()
            gradients.append(A.T @ (A @ x - b) / len(b))                 # c_i at x, all of i's samples
            y = x.clone()
            for _ in range(3):
                rows_A, rows_b = (t.double() for t in task.next_batch())
                y = y - lr_local * ((1 - beta) * rows_A.T @ (rows_A @ y - rows_b) / len(rows_b) + beta * s)
            changes.append(y - x)
        s = (1 - beta) * torch.stack(gradients).mean(0) + beta * s
        x = x + lr_global * torch.stack(changes).mean(0)
        torch.testing.assert_close(state.params.double(), x, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state.momentum.double(), s, rtol=1e-5, atol=1e-6)


def test_without_momentum_it_is_fedavg_bit_for_bit(tmp_path):
    run = assert_same_params(tmp_path, ["algorithm.name=mimelite", "algorithm.beta1=0", "algorithm.lr_global=0.8"],
                             ["algorithm.name=fedavg", "algorithm.lr_global=0.8"])
    # Twice FedAvg's traffic both ways: model change and full gradient up, model and momentum down.
    d, buffers = run.summary["num_params"], 2 * (8 + 6)
    assert run.history[0]["bytes_up"] == 4 * (2 * d + buffers) * 4
    assert run.history[0]["bytes_down"] == 4 * (2 * d + buffers) * 4


@pytest.mark.slow
def test_local_and_ray_engines_are_bitwise_identical(tmp_path, ray_cluster):
    assert_engines_agree(tmp_path, ["algorithm.name=mimelite"])


def test_resume_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch):
    assert_resume_agrees(tmp_path, monkeypatch, ["algorithm.name=mimelite"])
