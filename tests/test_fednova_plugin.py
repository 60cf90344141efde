"""The FedNova example plugin (examples/plugins/fednova.py; Wang et al., NeurIPS 2020, arXiv:2007.07481):
with equal step counts it is FedAvg, bit for bit; with local epochs on clients of different sizes its
round is the paper's normalised update, checked in float64 against FedAvg's own uploads of the same
round; each client's tau reaches clients.jsonl; the ray engine gives the local engine's bits."""
import json
import math
from pathlib import Path

import pytest
import torch

import rayfed
from rayfed.algorithms.fedavg import FedAvgM
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run, run
from tests.test_plugins import forget_plugins

FEDNOVA = Path(__file__).parents[1] / "examples" / "plugins" / "fednova.py"
PLUGIN = f"plugins=[{FEDNOVA}]"
LOCAL = SYNTHETIC_MLP + ["engine.backend=local", PLUGIN]
# Clients of the dirichlet partition hold 84 to 421 samples: one epoch of batches of 16 is 6 to 27 steps.
EPOCHS = ["train.local_epochs=1"]


@pytest.fixture(autouse=True, scope="module")
def forget():
    yield
    forget_plugins()


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]


def test_fednova_declares_sample_weighting_as_its_default():
    """p_i = n_i / n is the paper's weighting, and the plugin's Params declare it."""
    assert rayfed.load_config(None, [PLUGIN, "algorithm.name=fednova"]).algorithm.agg_weighting == "num_samples"


@pytest.mark.parametrize("weighting", ["num_samples", "uniform"])
def test_with_equal_steps_fednova_is_fedavg_bit_for_bit(tmp_path, weighting):
    """Four steps each: tau_eff = 4 exactly (from integers), and dividing each update by 4 and the
    average by 1/4 are exact in float32 (powers of two), so every round has FedAvg's bits."""
    overrides = LOCAL + ["train.local_steps=4", f"algorithm.agg_weighting={weighting}"]
    fedavg = run(tmp_path, overrides + ["algorithm.name=fedavg"], "fedavg")
    fednova = run(tmp_path, overrides + ["algorithm.name=fednova"], "fednova")
    assert torch.equal(fedavg.params, fednova.params)
    assert [r["train_loss"] for r in fedavg.history] == [r["train_loss"] for r in fednova.history]
    assert [r["tau_eff"] for r in fednova.history] == [4.0] * 4
    assert [(r["client_tau_min"], r["client_tau_max"]) for r in fednova.history] == [(4, 4)] * 4


def test_with_three_equal_steps_fednova_is_fedavg_to_float32_rounding(tmp_path):
    """Dividing by 3 and multiplying back rounds twice: the same model to within a few float32 ulps."""
    overrides = LOCAL + ["train.local_steps=3", "algorithm.agg_weighting=num_samples"]
    fedavg = run(tmp_path, overrides + ["algorithm.name=fedavg"], "fedavg")
    fednova = run(tmp_path, overrides + ["algorithm.name=fednova"], "fednova")
    assert torch.allclose(fedavg.params, fednova.params, rtol=0, atol=1e-6)


def test_with_local_epochs_a_round_is_the_papers_normalised_update(tmp_path, monkeypatch):
    """One round from the same model and batches: FedAvg's uploads Delta_i = y_i - x and step counts
    tau_i give, in float64, x + tau_eff sum_i p_i Delta_i / tau_i with p_i = n_i / n and
    tau_eff = sum_i p_i tau_i. FedNova's round is that, and FedAvg's is x + sum_i p_i Delta_i, another model."""
    seen = []
    step = FedAvgM.server_step

    def recording(self, state, uploads, round_info):
        seen.append((state.params.clone(), {client: (upload.tensors["model_change"].clone(), upload.num_samples,
                                                     upload.metrics["local_steps"])
                                            for client, upload in uploads.items()}))
        return step(self, state, uploads, round_info)

    monkeypatch.setattr(FedAvgM, "server_step", recording)
    overrides = LOCAL + EPOCHS + ["train.rounds=1", "algorithm.agg_weighting=num_samples",
                                  "logging.client_metrics=true"]
    fedavg = run(tmp_path, overrides + ["algorithm.name=fedavg"], "fedavg")
    fednova = run(tmp_path, overrides + ["algorithm.name=fednova"], "fednova")
    x, uploads = seen[0]
    total = sum(n for _, n, _ in uploads.values())
    steps = {client: tau for client, (_, _, tau) in uploads.items()}
    assert len(set(steps.values())) > 1                                 # the clients' step counts differ
    tau_eff = math.fsum(n * tau for _, n, tau in uploads.values()) / total
    normalised = sum((n / total) * change.double() / tau for change, n, tau in uploads.values())
    paper = x.double() + tau_eff * normalised
    averaged = x.double() + sum((n / total) * change.double() for change, n, _ in uploads.values())
    assert torch.allclose(fednova.params.double(), paper, rtol=0, atol=1e-6)
    assert torch.allclose(fedavg.params.double(), averaged, rtol=0, atol=1e-6)
    assert (paper - averaged).abs().max() > 1e-3
    assert fednova.history[0]["tau_eff"] == pytest.approx(tau_eff, rel=1e-15)
    # Each client's tau, as it reported it, is in clients.jsonl: FedAvg's clients took the same steps.
    assert {row["client"]: row["tau"] for row in rows(fednova.run_dir)} == steps
    assert {row["client"]: row["local_steps"] for row in rows(fedavg.run_dir)} == steps
    record = fednova.history[0]
    assert (record["client_tau_min"], record["client_tau_max"]) == (min(steps.values()), max(steps.values()))


@pytest.mark.slow
def test_on_the_ray_engine_fednova_and_its_clients_jsonl_are_the_local_engines(tmp_path, ray_cluster):
    overrides = [o for o in LOCAL if o != "engine.backend=local"] + EPOCHS + [
        "algorithm.name=fednova", "algorithm.agg_weighting=num_samples", "logging.client_metrics=true"]
    local = run(tmp_path, overrides + ["engine.backend=local"], "local")
    on_ray = run(tmp_path, overrides + [*ON_RAY, "engine.num_workers=2"], "ray")
    assert_same_run(local, on_ray)
    assert (local.run_dir / "clients.jsonl").read_bytes() == (on_ray.run_dir / "clients.jsonl").read_bytes()
