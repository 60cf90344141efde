"""GradMA-W, GradMA-S, GradMA, MIFA and MIFAM against specs/gradma.md §3.5-3.11 and the §7 checks."""
import functools

import pytest
import torch

from rayfed.algorithms.base import RoundInfo, Upload
from rayfed.algorithms.gradma import GradMA, GradMAClientState
from rayfed.preflight import load_config
from rayfed.errors import ConfigError
from rayfed.qp import QPStats, cone_project
from tests.fakes import DIM, NUM_CLIENTS, SCHEDULE, client, make, run_rounds

BLOCKS = [(0, 2), (2, DIM)]


def assert_same_params(left, right):
    for a, b in zip(left.states, right.states):
        assert torch.equal(a.params, b.params)


def identity_projection(self, gradient, constraints):
    return gradient, QPStats.unchanged(1, gradient.device)


# ---- worker side (checks 10-15) ----

def test_first_step_with_global_anchor_is_uncorrected_and_one_step_gradma_w_is_fedavg():
    """Checks 10, 11, 14: at tau = 0 a1 = a2 = g and a3 = 0, so the step is plain SGD."""
    for scope in ("model", "tensor"):
        gradma_w = make("gradma_w", anchor_mode="global", qp_scope=scope, lr_global=1.0)
        one_step = functools.partial(client, steps=1)
        assert_same_params(run_rounds(gradma_w, task_factory=one_step),
                           run_rounds(make("fedavg", lr_global=1.0), task_factory=one_step))


def test_gradma_w_with_the_qp_replaced_by_the_identity_is_fedavg(monkeypatch):
    """Check 14."""
    monkeypatch.setattr(GradMA, "_project_local", identity_projection)
    assert_same_params(run_rounds(make("gradma_w", lr_global=0.8)), run_rounds(make("fedavg", lr_global=0.8)))


def test_upload_is_the_sum_of_corrected_steps_and_every_step_is_feasible(monkeypatch):
    """Check 13: d = eta_l sum_tau gtilde_tau; and each gtilde satisfies its three constraints."""
    corrected_steps = []
    original = GradMA._project_local

    def recording(self, gradient, constraints):
        corrected, stats = original(self, gradient, constraints)
        for row in constraints:
            assert float(corrected @ row) >= -1e-5 * float(gradient.norm() * row.norm()) - 1e-12
        corrected_steps.append(corrected.clone())
        return corrected, stats

    monkeypatch.setattr(GradMA, "_project_local", recording)
    algorithm = make("gradma_w", lr_local=0.3)
    history = GradMAClientState(last_local=torch.randn(DIM, generator=torch.Generator().manual_seed(3)))
    upload, state = algorithm.client_train(client(2, steps=4), {"params": torch.zeros(DIM)}, history)
    assert len(corrected_steps) == 4
    assert torch.allclose(-upload.tensors["model_change"], 0.3 * torch.stack(corrected_steps).sum(0), atol=1e-6)
    assert torch.equal(state.last_local, upload.tensors["model_change"])     # xhat = x_{t,I} persisted
    assert upload.metrics["qp_local_active"] > 0                          # the random anchor makes the QP bite


def test_fedprox_equivalence_of_the_drift_constraint():
    """Check 12: a1, a2 feasible and <g, a3> < 0 give gtilde = g + z3 a3, z3 = -<g,a3>/||a3||^2."""
    g = torch.tensor([1.0, 0.0, 0.0, 0.0])
    a3 = torch.tensor([-1.0, 1.0, 0.0, 0.0])
    constraints = torch.stack([torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0, 1.0]), a3])
    corrected, info = cone_project(g, constraints)
    z3 = -(g @ a3) / (a3 @ a3)
    assert z3 > 0 and info.active == 1
    assert torch.allclose(corrected, g + z3 * a3)
    assert float(corrected @ a3) == pytest.approx(0.0, abs=1e-7)     # the drift does not grow to first order


def test_last_local_anchor_uses_the_clients_history_and_global_ignores_it():
    task = client(1)
    solution = torch.linalg.lstsq(task.A, task.b[:, None]).solution[:, 0]
    # At 2 w* the least-squares gradient is minus the one at 0: the a1 constraint must bite.
    history = GradMAClientState(last_local=2 * solution)
    start = {"params": torch.zeros(DIM)}
    fresh, _ = make("gradma_w").client_train(client(1), start, None)
    anchored, _ = make("gradma_w").client_train(client(1), start, history)
    ignored, _ = make("gradma_w", anchor_mode="global").client_train(client(1), start, history)
    assert anchored.metrics["qp_local_change"] > fresh.metrics["qp_local_change"]
    assert not torch.equal(anchored.tensors["model_change"], fresh.tensors["model_change"])
    assert torch.equal(ignored.tensors["model_change"], fresh.tensors["model_change"])


# ---- server side and memory (checks 16-19, 23, 24) ----

@pytest.mark.parametrize("beta1, beta2", [(0.0, 0.0), (0.5, 0.9), (0.9, 0.3)])
def test_gradma_s_without_memory_is_fedavgm(beta1, beta2):
    """Checks 16, 17."""
    gradma_s = make("gradma_s", memory_size=0, beta1=beta1, beta2=beta2)
    reference = make("fedavgm", beta1=beta1) if beta1 else make("fedavg")
    assert_same_params(run_rounds(gradma_s), run_rounds(reference))


def test_inactive_server_qp_reduces_to_fedavgm():
    """Check 18: uploads that are positive multiples of one vector never activate QP_g."""
    direction = torch.randn(DIM)
    gradma_s, fedavgm = make("gradma_s", memory_size=4, beta1=0.5, beta2=0.7), make("fedavgm", beta1=0.5)
    left, right = gradma_s.server_init(torch.zeros(DIM), NUM_CLIENTS), fedavgm.server_init(torch.zeros(DIM), NUM_CLIENTS)
    for round, sampled in enumerate(SCHEDULE):
        uploads = {c: Upload({"model_change": (1.0 + c) * direction}, 10) for c in sorted(sampled)}
        info = RoundInfo(round, tuple(sampled), NUM_CLIENTS)
        left, metrics = gradma_s.server_step(left, uploads, info)
        right, _ = fedavgm.server_step(right, uploads, info)
        assert torch.equal(left.params, right.params)
        assert metrics["qp_global_active"] == 0 and metrics["qp_global_change"] == 0.0


@pytest.mark.parametrize("scope", ["model", "tensor"])
def test_corrected_momentum_respects_every_memory_row(scope):
    """Check 19 (per block in tensor scope), and at most m rows are ever held. The memory is updated
    in place, so each round is replayed up to itself to see D as QP_g saw it."""
    evictions = 0
    for rounds in range(1, len(SCHEDULE) + 1):
        run = run_rounds(make("gradma_s", memory_size=3, beta1=0.9, beta2=0.5, qp_scope=scope), SCHEDULE[:rounds])
        state, metrics = run.states[-1], run.metrics[-1]
        assert metrics["memory_rows"] == len(state.memory.buffered) <= 3
        evictions += metrics["memory_evictions"]
        for start, stop in BLOCKS if scope == "tensor" else [(0, DIM)]:
            momentum, rows = state.optimizer.momentum[start:stop], state.memory.rows[:, start:stop]
            tolerance = 1e-6 * float(momentum.norm()) * rows.norm(dim=1) + 1e-12
            assert bool((rows @ momentum >= -tolerance).all())
    assert evictions > 0        # 6 clients through 3 rows


def test_gradma_pipeline_equivalences(monkeypatch):
    """Check 24: GradMA with m = 0 and beta1 = 0 is GradMA-W; with QP_l the identity it is GradMA-S."""
    assert_same_params(run_rounds(make("gradma", memory_size=0, beta1=0.0)), run_rounds(make("gradma_w")))
    gradma = run_rounds(make("gradma", memory_size=3, beta1=0.5, beta2=0.5))
    monkeypatch.setattr(GradMA, "_project_local", identity_projection)
    assert_same_params(run_rounds(make("gradma", memory_size=3, beta1=0.5, beta2=0.5)),
                       run_rounds(make("gradma_s", memory_size=3, beta1=0.5, beta2=0.5)))
    assert not torch.equal(gradma.states[-1].params, run_rounds(make("gradma_s", memory_size=3)).states[-1].params)


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.name=gradma_s", "algorithm.memory_size=5"], "algorithm.memory_size=5 is below train.clients_per_round=10"),
    (["algorithm.name=gradma", "algorithm.anchor_mode=first"], "algorithm.anchor_mode='first' must be one of"),
    (["algorithm.name=gradma_w", "algorithm.memory_size=100"], "algorithm.memory_size is not a parameter of gradma_w"),
    (["algorithm.name=gradma_s", "algorithm.beta2=1.0"], "algorithm.beta2=1.0 must be in [0, 1)"),
    (["algorithm.name=mifa", "algorithm.agg_weighting=num_samples"], "does not apply to mifa"),
])
def test_configuration_errors(overrides, message):
    """Check 23, and the other keys of the family."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        load_config(None, overrides)


def test_memory_size_zero_is_accepted():
    assert load_config(None, ["algorithm.name=gradma_s", "algorithm.memory_size=0"]).algorithm.memory_size == 0


# ---- MIFA (checks 26, 27) ----

def test_mifam_without_momentum_is_mifa():
    assert_same_params(run_rounds(make("mifam", beta1=0.0)), run_rounds(make("mifa")))


def test_mifa_average_is_the_mean_of_every_clients_latest_update():
    run = run_rounds(make("mifa"))
    latest = {}
    for state, sampled, models in zip(run.states, SCHEDULE, run.client_models):
        previous_params = state.params - 0.7 * state.optimizer.momentum       # x_t, undoing x_{t+1} = x_t + eta_g m
        for client_id in sampled:
            latest[client_id] = models[client_id] - previous_params
        expected = torch.stack([latest.get(i, torch.zeros(DIM)) for i in range(NUM_CLIENTS)]).sum(0) / NUM_CLIENTS
        assert torch.allclose(state.average, expected, atol=1e-6)


def test_mifa_with_full_participation_is_fedavg():
    everyone = [list(range(NUM_CLIENTS))] * 4
    mifa, fedavg = run_rounds(make("mifa"), everyone), run_rounds(make("fedavg"), everyone)
    for a, b in zip(mifa.states, fedavg.states):
        assert torch.allclose(a.params, b.params, atol=1e-6)
