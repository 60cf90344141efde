"""Robust aggregation rules and Byzantine attacks: each rule against an independent float64 reference
written from its paper, each attack's upload against its paper's formula, the adversaries as the
config names them, and runs: the rule and the attack in place of the mean and the honest uploads,
the same bits on either engine, refusals before any work."""
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch

import rayfed
from rayfed.adversary import Adversaries, adversary_ids
from rayfed.adversary.alie import z_max
from rayfed.aggregation import bucket_means, combine
from rayfed.aggregation.base import TooFewInputs
from rayfed.aggregation.centered_clipping import CenteredClipping
from rayfed.aggregation.geometric_median import GeometricMedian
from rayfed.aggregation.krum import MultiKrum
from rayfed.aggregation.median import Median
from rayfed.aggregation.trimmed_mean import TrimmedMean
from rayfed.algorithms.base import Upload, weighted_average
from rayfed.registry import AGGREGATION_RULES, ATTACKS
from rayfed.seeding import Purpose, torch_generator
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run


def uploads(n, d, seed=0, outliers=0):
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(n, d))
    rows[:outliers] += 50.0                     # a few far-off rows, as Byzantine uploads would be
    return torch.tensor(rows, dtype=torch.float32)


# ---- the rules, each against a float64 reference from its paper ----

@pytest.mark.parametrize("n", [1, 2, 7, 10])
def test_median_is_the_coordinatewise_median(n):
    rows = uploads(n, 40, outliers=n // 3)
    expected = np.median(rows.double().numpy(), axis=0)
    assert np.allclose(Median()(rows, None).double().numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n, f", [(5, 0), (5, 2), (10, 3), (11, 1)])
def test_trimmed_mean_drops_f_values_at_each_end_of_every_coordinate(n, f):
    rows = uploads(n, 40, outliers=f)
    values = rows.double().numpy()
    expected = np.array([np.mean(sorted(column)[f:n - f]) for column in values.T])
    assert np.allclose(TrimmedMean(f)(rows, None).double().numpy(), expected, rtol=0, atol=1e-6)
    with pytest.raises(TooFewInputs, match=rf"aggregation.rule=trimmed_mean got {2 * f} input\(s\) this round; "
                                           rf"it needs at least {2 * f + 1}"):
        TrimmedMean(f)(rows[:2 * f], None)


def krum_reference(values, f):
    """Blanchard et al.'s score, pair by pair: the sum of the n - f - 2 smallest squared distances."""
    n = len(values)
    scores = []
    for i in range(n):
        distances = sorted(float(np.sum((values[i] - values[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(distances[:n - f - 2]))
    return np.array(scores)


@pytest.mark.parametrize("n, f, m", [(7, 2, 1), (10, 3, 1), (10, 3, None), (10, 2, 4), (12, 0, None)])
def test_krum_and_multi_krum_pick_the_lowest_scores(n, f, m):
    rows = uploads(n, 30, seed=n + f, outliers=f)
    values = rows.double().numpy()
    order = np.argsort(krum_reference(values, f), kind="stable")
    chosen = order[:m if m is not None else n - f]
    expected = values[chosen].mean(axis=0)
    result = MultiKrum(f, m, "multi_krum")(rows, None).double().numpy()
    assert np.allclose(result, expected, rtol=0, atol=1e-6)
    assert not set(chosen) & set(range(f))       # no far-off row is chosen
    if m == 1:
        assert np.array_equal(result, rows[order[0]].double().numpy())     # Krum returns an upload itself
    with pytest.raises(TooFewInputs, match=rf"it needs at least {2 * f + 3} \(2 num_byzantine \+ 3"):
        MultiKrum(f, m, "krum")(rows[:2 * f + 2], None)


@pytest.mark.parametrize("n, f", [(7, 1), (11, 2), (12, 2), (3, 0)])
def test_bulyan_averages_around_the_median_of_recursive_krum_picks(n, f):
    """El Mhamdi et al.: theta = n - 2f picks, each Krum over the rest (max(1, n' - f - 2) neighbours, as Flower),
    then per coordinate the mean of the beta = theta - 2f picked values closest to their median."""
    rows = uploads(n, 25, seed=3 * n + f, outliers=f)
    values = rows.double().numpy()
    remaining, picked = list(range(n)), []
    for _ in range(n - 2 * f):
        scores = []
        for i in remaining:
            distances = sorted(float(np.sum((values[i] - values[j]) ** 2)) for j in remaining if j != i)
            scores.append(sum(distances[:max(1, len(remaining) - f - 2)]))
        picked.append(remaining.pop(int(np.argmin(scores))))
    chosen = values[picked]
    median = np.median(chosen, axis=0)
    beta = len(picked) - 2 * f
    expected = np.array([column[np.argsort(np.abs(column - middle), kind="stable")[:beta]].mean()
                         for column, middle in zip(chosen.T, median)])
    rule = AGGREGATION_RULES.get("bulyan").target(
        rayfed.load_config(None, ["aggregation.rule=bulyan", f"aggregation.num_byzantine={f}",
                                  "train.clients_per_round=12"]).aggregation)
    assert rule.picks(rows) == picked
    result = rule(rows, None).double().numpy()
    assert np.allclose(result, expected, rtol=0, atol=1e-6)
    # Two far-off rows may be each other's nearest neighbour late in the recursion; the trimming around the
    # median keeps them out of the output.
    assert (values[f:].min(axis=0) <= result).all() and (result <= values[f:].max(axis=0)).all()
    with pytest.raises(TooFewInputs, match=rf"it needs at least {4 * f + 3} \(4 num_byzantine \+ 3"):
        rule(rows[:4 * f + 2], None)


@pytest.mark.parametrize("n, outliers", [(3, 0), (8, 2), (15, 5)])
def test_geometric_median_minimises_the_sum_of_distances(n, outliers):
    rows = uploads(n, 12, seed=n, outliers=outliers)
    values = rows.double().numpy()

    def objective(z):
        return np.linalg.norm(values - z, axis=1).sum()
    reference = scipy.optimize.minimize(objective, values.mean(axis=0), method="BFGS", options={"gtol": 1e-10}).x
    result = GeometricMedian(iterations=1000, tolerance=1e-12, smoothing=1e-9)(rows, None).double().numpy()
    assert objective(result) <= objective(reference) + 1e-5
    assert np.linalg.norm(result - reference) < 1e-3 * (1 + np.linalg.norm(reference))
    # A bounded number of steps stops early: one Weiszfeld step from the mean.
    distances = np.linalg.norm(values - values.mean(axis=0), axis=1)
    one_step = (values / distances[:, None]).sum(axis=0) / (1 / distances).sum()
    assert np.allclose(GeometricMedian(1, 0.0, 1e-9)(rows, None).double().numpy(), one_step, rtol=0, atol=1e-5)


@pytest.mark.parametrize("iterations", [1, 3])
def test_centered_clipping_moves_from_the_previous_aggregate_by_the_clipped_mean(iterations):
    rows = uploads(9, 20, outliers=2)
    previous = torch.full((20,), 0.3)
    tau = 2.0
    center = previous.double().numpy()
    for _ in range(iterations):
        steps = []
        for x in rows.double().numpy():
            offset = x - center
            steps.append(offset * min(1.0, tau / np.linalg.norm(offset)))
        center = center + np.mean(steps, axis=0)
    rule = CenteredClipping(tau, iterations)
    assert np.allclose(rule(rows, previous).double().numpy(), center, rtol=0, atol=1e-6)
    # The first round clips around zero.
    assert torch.equal(rule(rows, None), rule(rows, torch.zeros(20)))


def test_bucketing_averages_buckets_of_a_permutation_then_applies_the_rule():
    rows = uploads(7, 5)
    permutation = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    values = rows.double().numpy()
    expected = np.stack([values[[3, 0, 6]].mean(axis=0), values[[1, 5, 2]].mean(axis=0), values[[4]].mean(axis=0)])
    assert np.allclose(bucket_means(rows, 3, permutation).double().numpy(), expected, rtol=0, atol=1e-6)
    # combine draws the permutation from (seed, round) and uses it for every upload name.
    tensors = {client: {"model_change": rows[client], "momentum": -rows[client]} for client in range(7)}
    combined, state = combine(Median(), "median", tensors, {}, 3, seed=5, round=2)
    drawn = torch.randperm(7, generator=torch_generator(5, Purpose.BUCKETS, 2))
    buckets = bucket_means(rows, 3, drawn)
    assert torch.equal(weighted_average(combined, "model_change", "uniform"), Median()(buckets, None))
    assert torch.equal(weighted_average(combined, "momentum", "uniform"), Median()(-buckets, None))
    assert state == {}
    with pytest.raises(TypeError, match="^aggregation.rule: the server holds the rule's output over the round's uploads, not each one"):
        combined[0]
    with pytest.raises(ValueError, match="aggregation.rule=median treats every upload alike"):
        weighted_average(combined, "model_change", "uniform", {0: 1.0})
    # MIFA divides the round's sum by N: the rule's output stands for the mean of the 7 uploads.
    assert torch.equal(weighted_average(combined, "model_change", "uniform", divisor=20),
                       (Median()(buckets, None).double() * 7 / 20).float())


def test_a_stateful_rule_carries_its_outputs_from_round_to_round():
    rule = CenteredClipping(1.0, 1)
    first = {client: {"model_change": row} for client, row in enumerate(uploads(5, 4))}
    second = {client: {"model_change": row} for client, row in enumerate(uploads(5, 4, seed=1))}
    _, state = combine(rule, "centered_clipping", first, {}, 1, 0, 0)
    combined, _ = combine(rule, "centered_clipping", second, state, 1, 0, 1)
    rows = torch.stack([second[client]["model_change"] for client in range(5)])
    assert torch.equal(weighted_average(combined, "model_change", "uniform"), rule(rows, state["model_change"]))


# ---- the attacks, each against its paper's formula ----

def attack(name, **keys):
    section = rayfed.load_config(None, [f"adversary.attack={name}", "adversary.fraction=0.2",
                                        *(f"adversary.{key}={value}" for key, value in keys.items())]).adversary
    return ATTACKS.get(name).target(section)


def test_sign_flip_sends_minus_the_honest_upload():
    own = uploads(3, 10)
    assert torch.equal(attack("sign_flip").corrupt(own, None, 10, []), -own)


def test_gaussian_attack_sends_noise_of_the_given_deviation_from_each_adversarys_stream():
    generators = [torch_generator(0, Purpose.ATTACK, 4, client) for client in (2, 9)]
    sent = attack("gaussian", noise_std=3.0).corrupt(uploads(2, 200_000), None, 10, generators)
    assert abs(float(sent.double().std()) - 3.0) < 0.01 and abs(float(sent.double().mean())) < 0.01
    # Each adversary's draw is its own stream's: the same whoever else attacks.
    alone = attack("gaussian", noise_std=3.0).corrupt(uploads(1, 200_000), None, 10,
                                                       [torch_generator(0, Purpose.ATTACK, 4, 9)])
    assert torch.equal(alone[0], sent[1])


def test_label_flip_maps_each_label_l_to_L_minus_l_minus_1():
    labels = torch.arange(10)
    assert attack("label_flip").labels(labels, 10).tolist() == list(range(9, -1, -1))
    assert torch.equal(attack("label_flip").corrupt(uploads(2, 3), None, 10, []), uploads(2, 3))


@pytest.mark.parametrize("n, m", [(10, 2), (25, 5), (50, 12), (10, 6)])
def test_alie_sends_mean_plus_z_max_deviations_of_the_adversaries_own_uploads(n, m):
    supporters = max(math.floor(n / 2 + 1) - m, 1)
    z = scipy.stats.norm.ppf((n - supporters) / n)
    assert z_max(n, m) == pytest.approx(z, abs=1e-12)
    own = uploads(m, 30)
    values = own.double().numpy()
    expected = values.mean(axis=0) + z * values.std(axis=0, ddof=1)
    sent = attack("alie").corrupt(own, None, n, [])
    assert sent.shape == (m, 30) and torch.equal(sent[0], sent[-1])
    assert np.allclose(sent[0].double().numpy(), expected, rtol=0, atol=1e-5)
    fixed = attack("alie", alie_z=1.5).corrupt(own, None, n, [])[0].double().numpy()
    assert np.allclose(fixed, values.mean(axis=0) + 1.5 * values.std(axis=0, ddof=1), rtol=0, atol=1e-5)


def test_alie_z_max_for_the_papers_example():
    """n = 50 workers, m = 12 corrupted: s = 26 - 12 = 14, z_max = Phi^-1(36 / 50)."""
    assert z_max(50, 12) == pytest.approx(scipy.stats.norm.ppf(0.72), abs=1e-12)


def test_ipm_sends_minus_epsilon_times_the_honest_mean():
    own, others = uploads(2, 10), uploads(6, 10, seed=3)
    sent = attack("ipm", ipm_epsilon=0.5).corrupt(own, others, 8, [])
    expected = -0.5 * others.double().numpy().mean(axis=0)
    assert np.allclose(sent.double().numpy(), np.stack([expected] * 2), rtol=0, atol=1e-6)
    alone = attack("ipm").corrupt(own, None, 2, [])
    assert np.allclose(alone[0].double().numpy(), -0.1 * own.double().numpy().mean(axis=0), rtol=0, atol=1e-6)


def test_mimic_copies_the_honest_upload_furthest_along_their_main_spread_and_keeps_its_target():
    honest, ids = uploads(6, 8, seed=5), [0, 2, 3, 5, 6, 8]
    generators = [torch_generator(0, Purpose.ATTACK, 0, 1), torch_generator(0, Purpose.ATTACK, 0, 4)]
    start = torch.randn(8, generator=torch_generator(0, Purpose.ATTACK, 0, 1), dtype=torch.float64).numpy()
    values = honest.double().numpy()
    centred = values - values.mean(axis=0)
    direction = sum((row @ start) * row for row in centred)
    target = ids[int(np.argmax(values @ (direction / np.linalg.norm(direction))))]
    mimic = attack("mimic")
    sent, state = mimic.corrupt_stateful(uploads(2, 8), honest, ids, 8, generators, {})
    assert state == {"target": target}
    assert torch.equal(sent, honest[ids.index(target)].expand(2, -1))
    # Later rounds copy the same client, whatever its upload; without it, the attack chooses again.
    later = uploads(6, 8, seed=9)
    again, kept = mimic.corrupt_stateful(uploads(2, 8), later, ids, 8, generators, state)
    assert kept == state and torch.equal(again[1], later[ids.index(target)])
    others = [client for client in ids if client != target]
    _, chosen = mimic.corrupt_stateful(uploads(2, 8), later[:5], others, 7, generators, state)
    assert chosen["target"] in others


def test_the_adversaries_replace_only_their_own_uploads_and_know_only_what_their_attack_may():
    config = rayfed.load_config(None, ["data.num_clients=20", "adversary.attack=sign_flip",
                                       "adversary.clients=[3, 7, 11]"])
    adversaries = Adversaries.of(config)
    round_uploads = {client: Upload({"model_change": torch.full((4,), float(client))}, 10 + client)
                     for client in (1, 3, 5, 7)}
    corrupted, count, _ = adversaries.corrupt(0, round_uploads, {})
    assert count == 2 and list(corrupted) == [1, 3, 5, 7]
    assert corrupted[1] is round_uploads[1] and corrupted[5] is round_uploads[5]
    assert torch.equal(corrupted[3].tensors["model_change"], torch.full((4,), -3.0))
    assert corrupted[7].num_samples == 17
    seen = []

    class Spy(rayfed.Attack):
        def corrupt(self, own, others, num_uploads, generators):
            seen.append((own.shape[0], others, num_uploads))
            return own
    adversaries.attack = Spy()
    adversaries.corrupt(0, round_uploads, {})
    assert seen == [(2, None, 4)]               # not omniscient: the honest uploads are withheld


def test_the_adversaries_are_named_or_drawn_once_from_the_seed():
    def section(*overrides):
        return rayfed.load_config(None, ["adversary.attack=ipm", *overrides]).adversary
    assert adversary_ids(section("adversary.clients=[9, 2, 9]"), 100, 0).tolist() == [2, 9]
    drawn = adversary_ids(section("adversary.fraction=0.25"), 100, 4)
    assert len(drawn) == 25 and list(drawn) == sorted(set(drawn.tolist()))
    assert np.array_equal(drawn, adversary_ids(section("adversary.fraction=0.25"), 100, 4))
    assert not np.array_equal(drawn, adversary_ids(section("adversary.fraction=0.25"), 100, 5))


# ---- runs ----

SMALL = SYNTHETIC_MLP + ["engine.backend=local", "data.num_clients=20", "train.clients_per_round=10"]


def run(tmp_path, name, *overrides):
    return rayfed.run(rayfed.load_config(None, [*SMALL, *overrides]), run_dir=tmp_path / name, progress=False)


def test_a_rule_replaces_the_mean_the_server_step_reads(tmp_path, monkeypatch):
    """FedAvgM's server step reads the rule's output: the run equals one whose weighted average is the median."""
    import rayfed.algorithms.fedavg as fedavg
    median_run = run(tmp_path, "median", "aggregation.rule=median")
    mean_run = run(tmp_path, "mean")
    assert not torch.equal(median_run.params, mean_run.params)

    def median_average(uploads, name, weighting, weights=None, divisor=None):
        return Median()(torch.stack([upload.tensors[name] for upload in uploads.values()]), None)
    monkeypatch.setattr(fedavg, "weighted_average", median_average)
    assert_same_run(median_run, run(tmp_path, "patched"))


def test_an_attack_lowers_accuracy_and_the_rounds_count_the_adversaries(tmp_path):
    attacked = ["adversary.attack=sign_flip", "adversary.fraction=0.3"]
    honest = run(tmp_path, "honest").history[-1]["test_accuracy"]
    mean_attacked = run(tmp_path, "attacked", *attacked, "logging.client_metrics=true").history
    adversaries = set(adversary_ids(rayfed.load_config(None, [*SMALL, *attacked]).adversary, 20, 0).tolist())
    lines = [json.loads(line) for line in (tmp_path / "attacked" / "clients.jsonl").read_text().splitlines()]
    for metrics in mean_attacked:
        counted = {line["client"] for line in lines if line["round"] == metrics["round"]}
        assert metrics["num_adversaries"] == len(counted & adversaries)
    assert sum(metrics["num_adversaries"] for metrics in mean_attacked) > 0
    assert mean_attacked[-1]["test_accuracy"] < honest
    assert "num_adversaries" not in run(tmp_path, "plain").history[0]


def test_label_flipping_trains_the_adversaries_on_flipped_labels_vectorised_or_not(tmp_path):
    flipped = ["adversary.attack=label_flip", "adversary.fraction=0.5", "algorithm.name=fedavg",
               "model.name=relu_mlp"]
    sequential = run(tmp_path, "sequential", *flipped)
    vectorised = run(tmp_path, "vectorised", *flipped, "engine.vectorize=true")
    assert vectorised.summary["vectorized"] is True
    assert torch.allclose(sequential.params, vectorised.params, rtol=0, atol=1e-5)
    assert not torch.allclose(sequential.params, run(tmp_path, "honest", "algorithm.name=fedavg",
                                                     "model.name=relu_mlp").params, rtol=0, atol=1e-3)


@pytest.mark.slow
def test_rules_and_attacks_give_the_same_bits_on_either_engine(tmp_path, ray_cluster):
    overrides = ["aggregation.rule=multi_krum", "aggregation.num_byzantine=2", "adversary.attack=alie",
                 "adversary.fraction=0.25"]
    local = run(tmp_path, "local", *overrides)
    assert sum(metrics["num_adversaries"] for metrics in local.history) > 0
    flipping = ["aggregation.rule=geometric_median", "aggregation.bucket_size=2", "adversary.attack=label_flip",
                "adversary.fraction=0.25"]
    local_flipping = run(tmp_path, "local_flipping", *flipping)
    assert_same_run(local, run(tmp_path, "ray", *overrides, *ON_RAY, "engine.num_workers=2"))
    assert_same_run(local_flipping, run(tmp_path, "ray_flipping", *flipping, *ON_RAY, "engine.num_workers=3"))


@pytest.mark.parametrize("overrides, message", [
    (["aggregation.rule=krum"], "aggregation.rule=krum needs aggregation.num_byzantine"),
    (["aggregation.rule=krum", "aggregation.num_byzantine=4"],
     "aggregation.rule=krum needs at least 11 inputs a round (2 num_byzantine + 3, num_byzantine = 4), but "
     "train.clients_per_round=10 with aggregation.bucket_size=1 gives it 10"),
    (["aggregation.rule=trimmed_mean", "aggregation.num_byzantine=2", "aggregation.bucket_size=3"],
     "aggregation.rule=trimmed_mean needs at least 5 inputs a round (2 num_byzantine + 1, num_byzantine = 2), but "
     "train.clients_per_round=10 with aggregation.bucket_size=3 gives it 4"),
    (["aggregation.rule=bulyan", "aggregation.num_byzantine=2"],
     "aggregation.rule=bulyan needs at least 11 inputs a round (4 num_byzantine + 3, num_byzantine = 2), but "
     "train.clients_per_round=10 with aggregation.bucket_size=1 gives it 10"),
    (["aggregation.rule=centered_clipping"], "aggregation.rule=centered_clipping needs aggregation.clip_radius"),
    (["aggregation.iterations=3"], "aggregation.iterations only applies to aggregation.rule=centered_clipping or "
                                   "geometric_median"),
    (["aggregation.bucket_size=2"], "aggregation.bucket_size=2 needs a robust aggregation.rule: the mean of bucket "
                                    "means is the mean"),
    (["aggregation.rule=median", "algorithm.name=gradma_s"], "aggregation.rule=median does not apply to gradma_s, "
                                                             "whose server step reads each client's upload"),
    (["aggregation.rule=median", "algorithm.agg_weighting=num_samples"],
     "aggregation.rule=median does not apply with algorithm.agg_weighting=num_samples (the rule weighs every upload "
     "alike)"),
    (["aggregation.rule=median", "selection.selector=ucs"],
     "aggregation.rule=median does not apply with selection.selector=ucs (its per-client weights)"),
    (["aggregation.rule=median", "engine.partial_sums=true"],
     "aggregation.rule=median does not apply with engine.partial_sums (the server would see only the sums)"),
    (["adversary.attack=ipm"], "adversary.attack=ipm needs the adversaries: adversary.fraction or adversary.clients "
                               "(one of the two)"),
    (["adversary.attack=ipm", "adversary.fraction=0.1", "adversary.clients=[1]"],
     "adversary.attack=ipm needs the adversaries: adversary.fraction or adversary.clients (one of the two)"),
    (["adversary.fraction=0.1"], "adversary.fraction and adversary.clients need an adversary.attack other than none"),
    (["adversary.attack=ipm", "adversary.clients=[30]"],
     "adversary.clients names client 30, but data.num_clients=30 (ids 0 to 29)"),
    (["adversary.attack=gaussian", "adversary.fraction=0.1", "adversary.ipm_epsilon=2"],
     "adversary.ipm_epsilon only applies to adversary.attack=ipm"),
    (["adversary.attack=ipm", "adversary.fraction=0.1", "compression.name=qsgd", "algorithm.name=fedavg"],
     "adversary.attack=ipm does not apply with compression.name=qsgd (an attack replaces the decoded upload"),
    (["adversary.attack=ipm", "adversary.fraction=0.1", "algorithm.name=fedgate"],
     "adversary.attack=ipm does not apply with algorithm.name=fedgate (its clients' state follows the upload"),
])
def test_bad_combinations_are_refused_with_one_line(overrides, message):
    with pytest.raises(rayfed.ConfigError) as error:
        rayfed.load_config(None, [*SYNTHETIC_MLP, "train.clients_per_round=10", *overrides])
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_the_how_to_pages_plugin_adds_a_rule_and_an_attack(tmp_path):
    """The plugin example of docs/how-to/robustness.md, run as written."""
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "robustness.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", page, re.DOTALL).group(1)
    try:
        exec(compile(example, "robustness.md", "exec"), {})
        plugin = ["aggregation.rule=norm_bounded_mean", "aggregation.clip_radius=0.05",
                  "adversary.attack=scaled_sign_flip", "adversary.fraction=0.5"]
        result = run(tmp_path, "plugin", *plugin)
        assert result.history[-1]["num_adversaries"] > 0
        assert not torch.equal(result.params, run(tmp_path, "mean").params)
        # The attack's own key, in adversary.options: its default, or the value given.
        assert rayfed.load_config(None, [*SMALL, *plugin]).adversary.options == {"scale": 4.0}
        attack = plugin[2:]          # under the mean, which the scale reaches (the bounded mean clips it away)
        assert not torch.equal(run(tmp_path, "scale4", *attack).params,
                               run(tmp_path, "scale2", *attack, "adversary.options.scale=2").params)
        with pytest.raises(rayfed.ConfigError, match="^adversary.options.scael is not a key of "
                                                     "adversary.attack=scaled_sign_flip \\(its own keys: scale\\)$"):
            rayfed.load_config(None, [*SMALL, *plugin, "adversary.options.scael=2"])
        with pytest.raises(rayfed.ConfigError, match="register_rule\\('bad'\\): keys '1a' are not identifiers"):
            rayfed.register_rule("bad", keys={"1a": 1.0})
    finally:
        AGGREGATION_RULES.remove("norm_bounded_mean")
        ATTACKS.remove("scaled_sign_flip")
