"""Differential privacy: the accountant's epsilon against dp-accounting's (and pfl-research's construction)
computed independently, the sampler and the accountant's event agreeing for every selector and
availability model or the run refused, clipping and the noised sum's moments by Monte Carlo, noise
reproducible to the bit and independent of the workers, adaptive clipping's update, the budget stop,
and refusals before any work."""
import json
import math

import dp_accounting
import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import (GaussianMechanism, LaplaceMechanism,
                                                     PoissonSubsampledGaussianMechanism)

import rayfed
from rayfed.algorithms.base import weighted_average
from rayfed.cli import main
from rayfed.config import AVAILABILITIES, ROUND_POLICIES
from rayfed.privacy import CentralPrivacy, Gaussian, Laplace, LocalPrivacy, Privacy, event_of
from rayfed.privacy.accountant import Accountant, round_event
from rayfed.privacy.clipping import clip
from rayfed.registry import SELECTORS
from rayfed.seeding import Purpose, torch_generator
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run
from tests.test_tensorboard import assert_events_are_the_metrics

DELTA = 1e-5
DP = ["privacy.mechanism=gaussian", "privacy.clip_norm=0.5", f"privacy.delta={DELTA}"]
SMALL = SYNTHETIC_MLP + ["engine.backend=local", "data.num_clients=40", "train.clients_per_round=8"]


def config(*overrides):
    return rayfed.load_config(None, [*SMALL, *overrides])


# ---- the accountant ----

@pytest.mark.parametrize("q, z, rounds", [(0.01, 1.1, 1000), (0.2, 0.8, 30), (0.05, 2.0, 1)])
def test_poisson_rdp_and_pld_epsilons_are_dp_accountings(q, z, rounds):
    event = round_event(Gaussian(), z, "central", "poisson", 1000, round(q * 1000))
    for kind, fresh in (("rdp", RdpAccountant), ("pld", PLDAccountant)):
        independent = fresh().compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)).get_epsilon(DELTA)
        assert Accountant(kind, event, DELTA).epsilon(rounds) == pytest.approx(independent, rel=1e-12)


def test_poisson_pld_epsilon_is_pfl_researchs():
    """pfl-research's PLDPrivacyAccountant (pfl/privacy/privacy_accountant.py, v0.6.0): from_gaussian_mechanism
    with sensitivity 1, pessimistic estimate, connect-the-dots, discretisation 1e-4, self-composed per step."""
    q, z, rounds = 0.01, 1.1, 500
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=z, sensitivity=1, pessimistic_estimate=True, sampling_prob=q, use_connect_dots=True,
        value_discretization_interval=1e-4)
    pfl = pld.self_compose(rounds).get_epsilon_for_delta(DELTA)
    ours = Accountant("pld", round_event(Gaussian(), z, "central", "poisson", 1000, 10), DELTA).epsilon(rounds)
    assert ours == pytest.approx(pfl, rel=1e-3)


def prv_bounds(prv, rounds):
    """(lower bound, estimate, upper bound) of epsilon at DELTA, as pfl-research's PRVPrivacyAccountant composes them
    (pfl/privacy/privacy_accountant.py, v0.6.0: eps_error 0.07, delta_error 1e-10; it reports the estimate)."""
    return PRVAccountant(prvs=prv, max_self_compositions=rounds, eps_error=0.07,
                         delta_error=1e-10).compute_epsilon(DELTA, rounds)


def test_prv_epsilon_is_pfl_researchs_upper_bound_and_brackets_pld():
    """rayfed reports PRV's upper bound (a guarantee), within 0.07 of the estimate pfl-research reports; dp-accounting's
    PLD epsilon, computed by another method, lies between PRV's bounds."""
    q, z, rounds = 0.01, 1.1, 500
    lower, estimate, upper = prv_bounds(PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=z),
                                        rounds)
    event = round_event(Gaussian(), z, "central", "poisson", 1000, 10)
    assert Accountant("prv", event, DELTA).epsilon(rounds) == upper
    assert upper - estimate == pytest.approx(0.07, rel=1e-4)
    assert lower <= Accountant("pld", event, DELTA).epsilon(rounds) <= upper


def test_prv_brackets_the_exact_epsilon_of_local_gaussian_reports():
    z, rounds = 4.0, 12
    event = round_event(Gaussian(), z, "local", "uniform", 500, 25)
    lower, _, upper = prv_bounds(GaussianMechanism(noise_multiplier=z / 2), rounds)
    assert lower <= gaussian_epsilon(2 * math.sqrt(rounds) / z, DELTA) <= upper
    assert Accountant("prv", event, DELTA).epsilon(rounds) == upper
    laplace = round_event(Laplace(), z, "local", "uniform", 500, 25)
    lower, _, upper = prv_bounds(LaplaceMechanism(mu=2 / z), rounds)
    assert Accountant("prv", laplace, DELTA).epsilon(rounds) == upper
    assert lower <= Accountant("pld", laplace, DELTA).epsilon(rounds) <= upper


def test_uniform_sampling_is_accounted_as_sampling_without_replacement_with_replace_one_neighbours():
    """S of N without replacement: replace-one neighbours, so a clipped sum's sensitivity is 2C and the event's
    multiplier z / 2."""
    event = round_event(Gaussian(), 1.5, "central", "uniform", 500, 25)
    independent = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE).compose(
        dp_accounting.SampledWithoutReplacementDpEvent(500, 25, dp_accounting.GaussianDpEvent(0.75)), 40)
    assert Accountant("rdp", event, DELTA).epsilon(40) == pytest.approx(independent.get_epsilon(DELTA), rel=1e-12)


def gaussian_epsilon(mu, delta):
    """The exact epsilon at delta of a Gaussian mechanism of sensitivity / deviation mu (Balle and Wang, ICML
    2018, Theorem 8: delta = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu))."""
    return scipy.optimize.brentq(lambda eps: scipy.stats.norm.cdf(mu / 2 - eps / mu)
                                 - math.exp(eps) * scipy.stats.norm.cdf(-mu / 2 - eps / mu) - delta, 0, 200)


@pytest.mark.parametrize("z, rounds", [(4.0, 12), (1.0, 3)])
def test_local_reports_compose_over_the_rounds(z, rounds):
    """A client's report moves by at most 2C when its data is replaced and carries noise zC: t of them are one
    Gaussian mechanism with mu = 2 sqrt(t) / z, whose exact epsilon PLD meets and RDP bounds."""
    event = round_event(Gaussian(), z, "local", "uniform", 500, 25)
    exact = gaussian_epsilon(2 * math.sqrt(rounds) / z, DELTA)
    assert Accountant("pld", event, DELTA).epsilon(rounds) == pytest.approx(exact, rel=1e-3)
    assert exact < Accountant("rdp", event, DELTA).epsilon(rounds) < 1.2 * exact
    independent = RdpAccountant().compose(dp_accounting.GaussianDpEvent(z / 2), rounds).get_epsilon(DELTA)
    assert Accountant("rdp", event, DELTA).epsilon(rounds) == pytest.approx(independent, rel=1e-12)


def test_laplace_with_poisson_sampling_is_accounted_by_pld():
    event = round_event(Laplace(), 2.0, "central", "poisson", 1000, 50)
    independent = PLDAccountant().compose(dp_accounting.PoissonSampledDpEvent(
        0.05, dp_accounting.LaplaceDpEvent(2.0)), 20).get_epsilon(DELTA)
    assert Accountant("pld", event, DELTA).epsilon(20) == pytest.approx(independent, rel=1e-12)


@pytest.mark.parametrize("selector", sorted(SELECTORS.names()))
@pytest.mark.parametrize("availability", AVAILABILITIES)
@pytest.mark.parametrize("policy", ROUND_POLICIES)
def test_every_sampler_has_the_event_that_describes_it_or_is_refused(selector, availability, policy, tmp_path):
    overrides = [*DP, "privacy.noise_multiplier=1.0", f"selection.selector={selector}",
                 f"systems.availability={availability}", f"train.round_policy={policy}"]
    extra = {"deadline": ["train.deadline_s=1000"], "async_buffered": ["train.buffer_size=4"]}.get(policy, [])
    if availability == "trace":
        trace = tmp_path / "trace.csv"
        trace.write_text("client,round,online\n" + "".join(f"{c},0,1\n" for c in range(40)))
        extra.append(f"systems.trace={trace}")
    try:
        resolved = config(*overrides, *extra)
    except rayfed.ConfigError as error:
        assert "\n" not in str(error)
        assert (selector not in ("uniform", "poisson") or availability != "always"
                or policy == "async_buffered" or (policy == "overcommit" and selector == "poisson")), str(error)
        return
    assert selector in ("uniform", "poisson") and availability == "always" and policy in ("sync", "deadline",
                                                                                            "overcommit")
    event = event_of(resolved, 1.0).event
    if selector == "poisson":
        assert event == dp_accounting.PoissonSampledDpEvent(8 / 40, dp_accounting.GaussianDpEvent(1.0))
    else:
        sampled = math.ceil(8 * 1.3) if policy == "overcommit" else 8
        assert event == dp_accounting.SampledWithoutReplacementDpEvent(40, sampled, dp_accounting.GaussianDpEvent(0.5))


@pytest.mark.parametrize("selector", ["uniform", "poisson"])
def test_the_sampler_draws_as_its_event_says(selector):
    """Uniform: exactly S distinct clients a round; Poisson: each client in a round with probability q,
    independently (a count that varies as Binomial(N, q))."""
    from rayfed.selection.sampler import ClientSampler
    from rayfed.systems.availability import AllClients
    sampler = ClientSampler(config(f"selection.selector={selector}").selection, 3, np.full(40, 10))
    draws = [sampler.choose(round, AllClients(40), 8).clients for round in range(4000)]
    counts = np.array([len(set(draw.tolist())) for draw in draws])
    assert all(len(set(draw.tolist())) == len(draw) for draw in draws)
    inclusion = np.bincount(np.concatenate(draws), minlength=40) / len(draws)
    assert np.abs(inclusion - 0.2).max() < 0.03
    if selector == "uniform":
        assert set(counts) == {8}
    else:
        assert abs(counts.mean() - 8) < 0.15 and abs(counts.var() - 40 * 0.2 * 0.8) < 0.6


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_target_epsilon_solves_for_the_smallest_noise_that_keeps_it(accountant):
    """Under Poisson sampling, whose RDP is quick to compute (sampling without replacement's takes seconds a z)."""
    poisson = [*DP, "selection.selector=poisson", "train.rounds=30", f"privacy.accountant={accountant}"]
    resolved = config(*poisson, "privacy.target_epsilon=4")
    z = resolved.privacy.noise_multiplier
    spent = Accountant(accountant, event_of(resolved, z), DELTA).epsilon(30)
    step = 10.0 ** (math.floor(math.log10(z)) - 3)      # z has 4 significant digits: the next smaller such z
    assert spent <= 4 and Accountant(accountant, event_of(resolved, z - step), DELTA).epsilon(30) > 4
    assert z == round(z, 3 - math.floor(math.log10(z)))
    assert config(*poisson, f"privacy.noise_multiplier={z}",
                  "privacy.target_epsilon=4").privacy.noise_multiplier == z      # a resolved config.yaml loads again


# ---- clipping and noise ----

def test_clipping_bounds_the_joint_norm_and_per_layer_each_block():
    rng = np.random.default_rng(0)
    upload = {"model_change": torch.tensor(rng.normal(size=10), dtype=torch.float32),
              "momentum": torch.tensor(rng.normal(size=10), dtype=torch.float32)}
    joint = math.sqrt(sum(float((t.double() ** 2).sum()) for t in upload.values()))
    clipped, norm = clip(upload, 1.0, 2, False, None)
    assert norm == pytest.approx(joint)
    for name, value in clipped.items():
        assert torch.allclose(value, upload[name].double() / joint, rtol=0, atol=1e-12)
    unchanged, _ = clip(upload, joint * 2, 2, False, None)
    assert all(torch.equal(unchanged[name], upload[name].double()) for name in upload)
    blocks = [(0, 4), (4, 10)]
    per_layer, _ = clip(upload, 1.0, 2, True, blocks)
    for value in per_layer.values():
        for start, end in blocks:
            assert float(torch.linalg.vector_norm(value[start:end])) <= 1.0 / 2 + 1e-12      # C / sqrt(4 parts)
    l1, _ = clip(upload, 1.0, 1, False, None)
    assert sum(float(value.abs().sum()) for value in l1.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("mechanism, variance", [(Gaussian(), lambda s: s ** 2), (Laplace(), lambda s: 2 * s ** 2)])
def test_the_noised_average_has_the_mechanisms_mean_and_variance(mechanism, variance):
    """Over 4,000 rounds' draws: mean the clipped uploads' average, variance (scale / S)^2 (Laplace: 2 b^2 / S^2)
    per coordinate, within 5% (the variance's standard error is about 2% here)."""
    rng = np.random.default_rng(1)
    uploads = {client: {"model_change": torch.tensor(rng.normal(size=50), dtype=torch.float32)} for client in range(4)}
    private = CentralPrivacy(mechanism, noise_multiplier=0.8, per_layer=False, blocks=(), clients_per_round=4, seed=7)
    averages = torch.stack([weighted_average(private.combine(round, uploads, 2.0)[0], "model_change", "uniform").double()
                            for round in range(4000)])
    clipped = sum(clip(upload, 2.0, mechanism.norm, False, None)[0]["model_change"] for upload in uploads.values()) / 4
    scale = 0.8 * 2.0
    assert torch.allclose(averages.mean(dim=0), clipped, rtol=0, atol=5 * math.sqrt(variance(scale)) / 4 / math.sqrt(4000))
    measured = float(averages.var(dim=0).mean())
    assert measured == pytest.approx(variance(scale) / 16, rel=0.05)


def test_the_noise_is_the_rounds_stream_and_the_average_what_the_server_step_reads():
    uploads = {client: {"model_change": torch.full((6,), float(client + 1))} for client in range(3)}
    private = CentralPrivacy(Gaussian(), 1.0, False, (), 3, seed=11)
    combined, metrics, next_clip = private.combine(5, uploads, 2.0)
    generator = torch_generator(11, Purpose.PRIVACY_NOISE, 5)
    expected = sum(clip(upload, 2.0, 2, False, None)[0]["model_change"] for upload in uploads.values())
    noised = expected + torch.randn(6, generator=generator, dtype=torch.float64) * 2.0
    assert torch.equal(weighted_average(combined, "model_change", "uniform"), (noised / 3).float())
    assert torch.equal(weighted_average(private.combine(5, uploads, 2.0)[0], "model_change", "uniform"),
                       (noised / 3).float())
    # MIFA's server divides the round's sum by N, not S.
    assert torch.equal(weighted_average(combined, "model_change", "uniform", divisor=40), (noised / 40).float())
    assert next_clip == 2.0 and metrics["dp_noise_scale"] == 2.0
    with pytest.raises(TypeError, match="^privacy.mechanism: the server holds the noised sum"):
        len(combined)


def test_adaptive_clipping_moves_the_clip_towards_the_quantile_and_pays_out_of_z():
    """Andrew et al.: b = (unclipped + N(0, sigma_b^2)) / S, C <- C exp(-eta (b - gamma)); the update's noise
    multiplier (z^-2 - (2 sigma_b)^-2)^-1/2."""
    norms = [0.5, 1.0, 3.0, 4.0]
    uploads = {client: {"model_change": torch.tensor([norm, 0.0])} for client, norm in enumerate(norms)}
    private = CentralPrivacy(Gaussian(), 1.0, False, (), 4, seed=2, adaptive=True, target_quantile=0.5,
                             clip_learning_rate=0.2, count_stddev=2.0)
    _, metrics, next_clip = private.combine(0, uploads, 2.0)
    generator = torch_generator(2, Purpose.PRIVACY_NOISE, 0)
    torch.randn(2, generator=generator, dtype=torch.float64)          # the update's noise comes first
    fraction = (2 + float(torch.randn(1, generator=generator, dtype=torch.float64)) * 2.0) / 4
    assert metrics["dp_unclipped_fraction"] == pytest.approx(fraction, rel=1e-12)
    assert next_clip == pytest.approx(2.0 * math.exp(-0.2 * (fraction - 0.5)), rel=1e-12)
    assert metrics["dp_noise_scale"] == pytest.approx((1.0 - (2 * 2.0) ** -2) ** -0.5 * 2.0, rel=1e-12)


def test_local_privacy_clips_and_noises_each_upload_from_its_clients_stream():
    private = LocalPrivacy(Gaussian(), 0.5, 1.0, False, (), seed=4)
    upload = {"model_change": torch.full((5,), 3.0)}
    sent = private.privatize(upload, round=2, client_id=9)["model_change"]
    generator = torch_generator(4, Purpose.PRIVACY_NOISE, 2, 9)
    expected = (upload["model_change"].double() / math.sqrt(45) + torch.randn(5, generator=generator,
                                                                              dtype=torch.float64) * 0.5).float()
    assert torch.equal(sent, expected)


# ---- runs ----

def run(tmp_path, name, *overrides):
    return rayfed.run(config(*overrides), run_dir=tmp_path / name, progress=False)


def test_a_private_run_logs_its_epsilon_every_round_to_every_output(tmp_path):
    result = run(tmp_path, "dp", *DP, "privacy.noise_multiplier=0.05", "logging.tensorboard=true",
                 "algorithm.name=fedadam", "compression.name=qsgd")
    resolved = config(*DP, "privacy.noise_multiplier=0.05")
    accountant = Accountant("rdp", event_of(resolved, 0.05), DELTA)
    assert [record["dp_epsilon"] for record in result.history] == [accountant.epsilon(t) for t in range(1, 5)]
    assert result.summary["privacy"]["epsilon"] == accountant.epsilon(4)
    assert result.summary["privacy"]["event"].startswith("SampledWithoutReplacementDpEvent(source_dataset_size=40, "
                                                         "sample_size=8")
    assert "dp_epsilon" in assert_events_are_the_metrics(result.run_dir, 4)
    assert main(["report", str(result.run_dir), "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| epsilon |" in table and f"{accountant.epsilon(4):.4f}" in table


def test_a_prv_run_logs_its_upper_bound_at_the_evaluated_rounds(tmp_path):
    prv = [*DP, "privacy.noise_multiplier=1.0", "selection.selector=poisson", "privacy.accountant=prv",
           "train.eval_every=2"]
    result = run(tmp_path, "prv", *prv)
    accountant = Accountant("prv", event_of(config(*prv), 1.0), DELTA)
    assert {record["round"]: record["dp_epsilon"] for record in result.history if "dp_epsilon" in record} == {
        2: accountant.epsilon(2), 4: accountant.epsilon(4)}
    assert result.summary["privacy"]["accountant"] == "prv" and result.summary["privacy"]["epsilon"] == \
        accountant.epsilon(4)


def test_without_noise_and_clipping_nothing_changes(tmp_path):
    """privacy.mechanism=none is the plain run; a clip no upload reaches and z = 0 give the mean's bits up to
    float64 summation (they sum in float64, the mean in float32)."""
    plain = run(tmp_path, "plain")
    loose = run(tmp_path, "loose", "privacy.mechanism=gaussian", "privacy.clip_norm=1e6", f"privacy.delta={DELTA}",
                "privacy.noise_multiplier=0", "algorithm.name=fedavgm")
    assert torch.allclose(plain.params, loose.params, rtol=0, atol=1e-5)
    assert loose.history[-1]["dp_epsilon"] is None            # no noise: no privacy (inf, null in JSON)


LOOSE = ["privacy.mechanism=gaussian", "privacy.clip_norm=1e6", f"privacy.delta={DELTA}", "privacy.noise_multiplier=0"]


def test_mifas_memory_reads_the_noised_sum_divided_by_n(tmp_path):
    """MIFA's server adds the round's summed differences / N to its memory's average: under central privacy the
    noised sum (float64) / N; with a clip no upload reaches and z = 0 that is the plain run up to the summation."""
    plain = run(tmp_path, "plain", "algorithm.name=mifam")
    loose = run(tmp_path, "loose", *LOOSE, "algorithm.name=mifam")
    assert not torch.equal(plain.params, loose.params)
    assert torch.allclose(plain.params, loose.params, rtol=0, atol=1e-5)


def test_an_algorithm_that_averages_models_is_clipped_on_its_changes_from_the_broadcast():
    """FedLALR's clients upload x_i, m_i and v_hat_i: the server averages x_t + (sum_i clip(u_i - x_t) + noise) / S."""
    reference = {"params": torch.full((4,), 10.0), "v_hat": torch.full((2,), 1.0)}
    uploads = {client: {"params": reference["params"] + client + 1.0, "v_hat": reference["v_hat"] * 2}
               for client in range(3)}
    private = CentralPrivacy(Gaussian(), 0.5, False, (), 3, seed=2)
    combined, _, _ = private.combine(1, uploads, 1.5, reference)
    generator = torch_generator(2, Purpose.PRIVACY_NOISE, 1)
    clipped = [clip({name: upload[name].double() - reference[name].double() for name in upload}, 1.5, 2, False,
                    None)[0] for upload in uploads.values()]
    for name, size in (("params", 4), ("v_hat", 2)):
        noise = torch.randn(size, generator=generator, dtype=torch.float64) * 0.75
        expected = ((sum(change[name] for change in clipped) + noise) / 3 + reference[name].double()).float()
        assert torch.equal(weighted_average(combined, name, "uniform"), expected)
    local = LocalPrivacy(Gaussian(), 0.5, 1.5, False, (), seed=2).privatize(uploads[0], 1, 0, reference)
    assert torch.allclose(local["params"], reference["params"] + clipped[0]["params"].float(), atol=3.0)
    assert not torch.equal(local["params"], uploads[0]["params"])


@pytest.mark.parametrize("scope", ["central", "local"])
def test_fedlalrs_model_average_composes_with_privacy(tmp_path, scope):
    """With a clip no change reaches and z = 0: locally each client sends its own bits (x_t + (x_i - x_t) in
    float64 is x_i); centrally the average is the plain one up to its float32 rounding, compared after one
    round because AMSGrad's 1 / sqrt(v_hat), v_hat starting at eps^2, amplifies rounding from round 2 on."""
    rounds = "train.rounds=4" if scope == "local" else "train.rounds=1"
    plain = run(tmp_path, "plain", "algorithm.name=fedlalr", rounds)
    loose = run(tmp_path, f"loose_{scope}", *LOOSE, f"privacy.scope={scope}", "algorithm.name=fedlalr", rounds)
    if scope == "local":
        assert torch.equal(plain.params, loose.params)
    else:
        assert torch.allclose(plain.params, loose.params, rtol=0, atol=1e-6)
    noised = run(tmp_path, f"noised_{scope}", *DP, "privacy.noise_multiplier=0.5", f"privacy.scope={scope}",
                 "algorithm.name=fedlalr")
    assert not torch.equal(plain.params, noised.params) and torch.isfinite(noised.params).all()


@pytest.mark.parametrize("algorithm", ["gradma_s", "scaffold", "feddyn"])
def test_local_privacy_noises_what_a_memory_or_a_control_variate_holds(tmp_path, algorithm):
    """Under local privacy the server, whatever it keeps of each upload (GradMA-S's memory D, SCAFFOLD's and
    FedDyn's server states), only sees the noised uploads; a clip no upload reaches and z = 0 send each upload's
    own bits."""
    plain = run(tmp_path, "plain", f"algorithm.name={algorithm}")
    loose = run(tmp_path, "loose", *LOOSE, "privacy.scope=local", f"algorithm.name={algorithm}")
    assert torch.equal(plain.params, loose.params)
    assert [record["train_loss"] for record in plain.history] == [record["train_loss"] for record in loose.history]
    noised = run(tmp_path, "noised", *DP, "privacy.noise_multiplier=0.5", "privacy.scope=local",
                 f"algorithm.name={algorithm}")
    assert not torch.equal(plain.params, noised.params) and torch.isfinite(noised.params).all()


def test_the_budget_stops_the_run_before_the_round_that_would_exceed_it(tmp_path):
    result = run(tmp_path, "budget", *DP, "privacy.noise_multiplier=1.0", "train.target_epsilon=15",
                 "train.rounds=10")
    accountant = Accountant("rdp", event_of(config(*DP, "privacy.noise_multiplier=1.0"), 1.0), DELTA)
    last = max(t for t in range(1, 11) if accountant.epsilon(t) <= 15)
    assert len(result.history) == last < 10 and accountant.epsilon(last + 1) > 15
    assert result.summary["status"] == "privacy_budget_spent"
    assert result.summary["stopped_because"] == (
        f"round {last + 1} would take epsilon to {accountant.epsilon(last + 1):.4g}, above train.target_epsilon=15.0 "
        f"(after round {last}: {accountant.epsilon(last):.4g} at delta=1e-05)")
    with pytest.raises(rayfed.RunFinished, match="spent its privacy budget"):
        rayfed.resume(result.run_dir, progress=False)


@pytest.mark.slow
def test_noise_is_the_same_on_either_engine_and_any_workers(tmp_path, ray_cluster):
    central = [*DP, "privacy.noise_multiplier=0.3", "privacy.adaptive_clipping=true", "selection.selector=poisson"]
    local = [*DP, "privacy.noise_multiplier=0.3", "privacy.scope=local"]
    assert_same_run(run(tmp_path, "central", *central),
                    run(tmp_path, "central_ray", *central, *ON_RAY, "engine.num_workers=3"))
    assert_same_run(run(tmp_path, "local", *local), run(tmp_path, "local_ray", *local, *ON_RAY, "engine.num_workers=2"))


def test_local_privacy_vectorised_or_not_gives_the_same_run(tmp_path):
    local = [*DP, "privacy.noise_multiplier=0.3", "privacy.scope=local", "algorithm.name=fedavg",
             "model.name=relu_mlp"]
    assert torch.allclose(run(tmp_path, "sequential", *local).params,
                          run(tmp_path, "vectorised", *local, "engine.vectorize=true").params, rtol=0, atol=1e-5)


@pytest.mark.parametrize("overrides, message", [
    (["privacy.mechanism=gaussian"], "privacy.mechanism=gaussian needs privacy.clip_norm"),
    ([*DP], "privacy.mechanism=gaussian needs privacy.noise_multiplier or privacy.target_epsilon"),
    (["privacy.clip_norm=1"], "privacy.clip_norm needs a privacy.mechanism other than none"),
    (["train.target_epsilon=3"], "train.target_epsilon needs a privacy.mechanism other than none"),
    ([*DP, "privacy.noise_multiplier=1", "algorithm.name=gradma_s"],
     "privacy.mechanism=gaussian does not apply with algorithm.name=gradma_s and privacy.scope=central: its server "
     "step reads each client's upload, not only the noised sum (central applies to: "),
    ([*DP, "privacy.noise_multiplier=1", "algorithm.name=fedlalr", "algorithm.vhat_agg=max"],
     "algorithm.vhat_agg=max (Algorithm 3) takes the largest of each client's v_hat, which privacy.mechanism=gaussian "
     "(privacy.scope=central) does not hand the server: use vhat_agg=mean"),
    ([*DP, "privacy.noise_multiplier=1", "selection.selector=acs"],
     "privacy.mechanism=gaussian does not apply with selection.selector=acs: its draws or weights depend on the "
     "clients' data (sample counts, losses, gradients); use uniform or poisson"),
    ([*DP, "privacy.noise_multiplier=1", "engine.partial_sums=true"],
     "privacy.mechanism=gaussian does not apply with engine.partial_sums: the workers would sum the uploads before "
     "the server clips them"),
    ([*DP, "privacy.noise_multiplier=1", "aggregation.rule=median"],
     "privacy.mechanism=gaussian does not apply with aggregation.rule=median: the noise is calibrated to a sum's "
     "sensitivity, not the rule's"),
    ([*DP, "privacy.noise_multiplier=1", "systems.availability=bernoulli"],
     "privacy.mechanism=gaussian does not apply with systems.availability=bernoulli: who is online changes each "
     "client's chance of being sampled, which the accountant's event does not describe"),
    ([*DP, "privacy.noise_multiplier=1", "privacy.accountant=prv"],
     "privacy.accountant=prv has no account of privacy.mechanism=gaussian with selection.selector=uniform "
     "(privacy.scope=central); privacy.accountant=rdp has one"),
    ([*DP, "privacy.noise_multiplier=1", "privacy.accountant=pld"],
     "privacy.accountant=pld has no account of privacy.mechanism=gaussian with selection.selector=uniform "
     "(privacy.scope=central); privacy.accountant=rdp has one"),
    (["privacy.mechanism=laplace", "privacy.clip_norm=1", f"privacy.delta={DELTA}", "privacy.noise_multiplier=1"],
     "privacy.accountant=rdp has no account of privacy.mechanism=laplace with selection.selector=uniform "
     "(privacy.scope=central); with selection.selector=poisson dp-accounting's pld accountant has one"),
    ([*DP, "privacy.noise_multiplier=1", "train.target_epsilon=0.01"],
     "train.target_epsilon=0.01 is below the epsilon of one round"),
    ([*DP, "privacy.noise_multiplier=1", "privacy.adaptive_clipping=true"],
     "privacy.adaptive_clipping pays for its count out of z, which must be below 2 sigma_b = 0.8"),
    ([*DP, "privacy.target_epsilon=1e5"], "privacy.target_epsilon=100000.0: 4 rounds with noise multiplier 0.1 "
                                          "already spend at most epsilon 100000.0: set privacy.noise_multiplier instead"),
])
def test_bad_privacy_settings_are_refused_with_one_line(overrides, message):
    with pytest.raises(rayfed.ConfigError) as error:
        config(*overrides)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_the_how_to_pages_mechanism_plugin_runs(tmp_path):
    """The mechanism example of docs/how-to/privacy.md, run as written."""
    import re
    from pathlib import Path
    from rayfed.registry import PRIVACY_MECHANISMS
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "privacy.md").read_text(encoding="utf-8")
    example = re.findall(r"```python\n(.*?)```", page, re.DOTALL)[-1]
    try:
        exec(compile(example, "privacy.md", "exec"), {})
        result = run(tmp_path, "plugin", "privacy.mechanism=gaussian_float32_draws", "privacy.clip_norm=0.5",
                     f"privacy.delta={DELTA}", "privacy.noise_multiplier=0.1")
        assert result.history[-1]["dp_epsilon"] == run(tmp_path, "builtin", *DP, "privacy.noise_multiplier=0.1"
                                                       ).history[-1]["dp_epsilon"]
    finally:
        PRIVACY_MECHANISMS.remove("gaussian_float32_draws")
