"""Client selection against specs/fedmos.md §9's selection checks (T12-T23): Algorithm 2's table,
and the selectors' weights, unbiasedness and variances by Monte Carlo (within 4 standard errors)."""
import numpy as np
import pytest

from rayfed.selection import acs_order, acs_table, select

ROUNDS = 20_000


def algorithm_2(importances, num_draws, order):
    """Algorithm 2 as printed (with the break of line 12), in float64: the reference for the closed form."""
    filled = np.zeros(len(importances))
    table = np.zeros((len(importances), num_draws))
    for m in range(num_draws):
        total = 0.0
        for i in order:
            if filled[i] < num_draws * importances[i]:
                q = min(num_draws * importances[i] - filled[i], 1.0)
                before, total = total, total + q
                if total <= 1:
                    table[i, m] = q
                    filled[i] += q
                else:
                    table[i, m] = 1 - before
                    filled[i] += table[i, m]
                    break
    return table


def random_counts(seed, num_clients=40):
    return np.random.default_rng(seed).integers(10, 51, size=num_clients)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("num_draws", [1, 5, 25, 40])
def test_t12_t13_t14_the_table_is_feasible_contiguous_and_algorithm_2(seed, num_draws):
    counts = random_counts(seed)
    p = counts / counts.sum()
    order = acs_order(counts)
    table = acs_table(counts, num_draws)
    assert (table >= 0).all() and (table <= 1).all()
    np.testing.assert_allclose(table.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(table.sum(axis=1), num_draws * p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(table, algorithm_2(p, num_draws, order), rtol=0, atol=1e-12)
    assert np.count_nonzero(table) <= len(counts) + num_draws - 1
    positions = {client: k for k, client in enumerate(order)}
    supports = [sorted(positions[i] for i in np.flatnonzero(table[:, m])) for m in range(num_draws)]
    for support in supports:
        assert support == list(range(support[0], support[-1] + 1))
    for left, right in zip(supports, supports[1:]):
        assert len(set(left) & set(right)) <= 1


def test_t15_uniform_importances_give_exact_blocks():
    table = acs_table(np.full(500, 7), 25)
    assert (np.count_nonzero(table, axis=0) == 20).all()
    assert np.array_equal(np.flatnonzero(table[:, 3]), np.arange(60, 80))
    np.testing.assert_allclose(table[table > 0], 20 / 500 * 25 / 20)
    uneven = acs_table(np.full(7, 3), 3)
    np.testing.assert_allclose(uneven.sum(axis=1), 3 / 7, rtol=0, atol=1e-15)


def test_t16_t17_t18_large_clients_determinism_and_the_papers_counterexample():
    counts = np.array([50, 5, 5, 40])          # M p_1 = 2.5 with M = 5
    table = acs_table(counts, 5)
    assert table[0, 0] == 1 and table[0, 1] == 1 and table[0, 2] == 0.5
    assert np.array_equal(acs_table(counts, 5), table)
    assert list(acs_order(np.array([2, 3, 3, 1]))) == [1, 2, 0, 3]            # ties by client id
    paper = acs_table(np.array([3, 3, 2, 2]), 2)
    np.testing.assert_allclose(paper, [[0.6, 0], [0.4, 0.2], [0, 0.4], [0, 0.4]], atol=1e-15)
    assert (paper ** 2).sum() == pytest.approx(0.88)



def dense_table(counts, num_draws, order):
    """Q in closed form over the whole clients x draws grid: what selection built before it kept only the
    nonzero entries (acs_columns), and the reference for them."""
    total = int(counts.sum())
    ends = np.cumsum(num_draws * counts[order])
    starts = ends - num_draws * counts[order]
    draw_starts = np.arange(num_draws, dtype=np.int64) * total
    overlap = np.minimum(ends[:, None], draw_starts + total) - np.maximum(starts[:, None], draw_starts)
    table = np.zeros((len(counts), num_draws))
    table[order] = np.maximum(overlap, 0) / total
    return table


def dense_draws(table, rng):
    """One draw per column of the whole table, as selection drew them before."""
    cumulative = np.cumsum(table, axis=0)
    return (cumulative > rng.random(table.shape[1]) * cumulative[-1]).argmax(axis=0)


@pytest.mark.parametrize("selector", ["acs", "cacs"])
def test_acs_and_cacs_draw_the_clients_and_weights_they_drew_from_the_whole_table(selector):
    """acs and cacs keep only Q's nonzero entries (at most N + M - 1, so N = 10^6 fits); every draw,
    weight and table entry is the one the whole N x M table gave, bit for bit."""
    rng = np.random.default_rng(21)
    for case in range(300):
        num_clients = int(rng.integers(1, 90))
        counts = rng.integers(0 if case % 3 == 0 else 1, 60, size=num_clients)
        counts[rng.integers(num_clients)] += 1              # some client has a sample
        num_draws = int(rng.integers(1, 2 * num_clients + 3))
        # cacs fills the table in its warm-up's order of the clients (here all online, ids 0..N-1)
        order = rng.permutation(num_clients) if selector == "cacs" else acs_order(counts)
        table = dense_table(counts, num_draws, order)
        assert np.array_equal(acs_table(counts, num_draws, order), table)
        seed = int(rng.integers(2 ** 32))
        drawn = dense_draws(table, np.random.default_rng(seed))
        ids, first_positions, times = np.unique(drawn, return_index=True, return_counts=True)
        in_order = np.argsort(first_positions, kind="stable")
        selection = select(selector, np.arange(num_clients), counts, num_draws, np.random.default_rng(seed),
                           order=order if selector == "cacs" else None)
        assert np.array_equal(selection.clients, ids[in_order])
        assert np.array_equal(selection.weights, times[in_order] / num_draws)


def monte_carlo(selector, counts, num_draws, vectors, variant="paper"):
    """Per round: each client's weight (0 when not selected), the aggregate, the weights' sum."""
    rng = np.random.default_rng(11)
    weights = np.zeros((ROUNDS, len(counts)))
    for round in range(ROUNDS):
        selection = select(selector, np.arange(len(counts)), counts, num_draws, rng, variant)
        assert len(set(selection.clients.tolist())) == len(selection.clients)
        weights[round, selection.clients] = selection.weights
    return weights, weights @ vectors


def within_4_se(samples, truth):
    mean, se = samples.mean(axis=0), samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
    assert (np.abs(mean - truth) <= 4 * se + 1e-12).all(), (mean, truth, se)


@pytest.mark.parametrize("selector", ["md", "acs"])
def test_t19_t20_multinomial_selectors_are_unbiased_with_the_exact_second_moment(selector):
    counts = random_counts(3, num_clients=12)
    p, num_draws = counts / counts.sum(), 4
    vectors = np.random.default_rng(5).normal(size=(12, 3))
    weights, aggregates = monte_carlo(selector, counts, num_draws, vectors)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    within_4_se(weights, p)
    within_4_se(aggregates, p @ vectors)
    table = acs_table(counts, num_draws) if selector == "acs" else np.repeat(p[:, None], num_draws, axis=1)
    # the stated inclusion probability: the draws are independent, each by its column of Q
    within_4_se(weights > 0, 1 - np.prod(1 - table, axis=1))
    second = (num_draws * p + num_draws ** 2 * p ** 2 - (table ** 2).sum(axis=1)) / num_draws ** 2   # Eq. (25)
    within_4_se(weights ** 2, second)


def test_t21_t22_acs_never_has_more_variance_than_md():
    rng = np.random.default_rng(2)
    for _ in range(100):
        counts = rng.integers(1, 60, size=15)
        p, num_draws = counts / counts.sum(), int(rng.integers(1, 8))
        vectors = rng.normal(size=(15, 4))
        table = acs_table(counts, num_draws)

        def variance(q):      # E||A - EA||^2 of §3.6
            return (num_draws * p @ (vectors ** 2).sum(axis=1) - ((q.T @ vectors) ** 2).sum()) / num_draws ** 2

        md = np.repeat(p[:, None], num_draws, axis=1)
        assert variance(table) <= variance(md) + 1e-12
        if num_draws == 1:
            assert variance(table) == pytest.approx(variance(md))
        assert ((table ** 2).sum(axis=1) >= num_draws * p ** 2 - 1e-12).all()


def test_t23_ucs_includes_m_of_n_and_is_unbiased_and_the_reference_variant_normalises():
    counts = random_counts(4, num_clients=10)
    p, num_draws = counts / counts.sum(), 3
    vectors = np.random.default_rng(6).normal(size=(10, 2))
    weights, aggregates = monte_carlo("ucs", counts, num_draws, vectors)
    within_4_se(weights > 0, np.full(10, 0.3))
    assert set(np.unique(np.round(weights / p, 9))) == {0.0, round(10 / 3, 9)}
    within_4_se(aggregates, p @ vectors)
    within_4_se((weights - p) ** 2, 10 / 3 * p ** 2 - p ** 2)
    reference, _ = monte_carlo("ucs", counts, num_draws, vectors, variant="reference_code")
    np.testing.assert_allclose(reference.sum(axis=1), 1.0, atol=1e-12)


def test_uniform_is_todays_sampling_and_short_supply_is_taken_whole():
    rng, again = np.random.default_rng(9), np.random.default_rng(9)
    chosen = select("uniform", np.arange(20) + 5, np.ones(20), 6, rng)
    assert chosen.weights is None
    assert np.array_equal(chosen.clients, (np.arange(20) + 5)[again.choice(20, size=6, replace=False)])
    assert sorted(select("ucs", np.array([3, 8]), np.array([5, 5]), 4, rng).clients) == [3, 8]


# ---- the selectors inside a run ----

def test_the_servers_aggregate_is_unbiased_under_every_selector():
    """FedAvg with lr_global 1 and fixed uploads v_i moves the model by -sum_i w_i v_i each round:
    its mean over rounds is -sum_i p_i v_i (full participation with importance weights)."""
    import torch
    from tests.test_server import fake_results, make_server
    from rayfed.selection import ClientOrder
    from rayfed.selection.sampler import ClientSampler
    for selector in ("md", "acs", "ucs", "cacs"):
        _, server = make_server("algorithm.name=fedavg", f"selection.selector={selector}", "train.eval_every=1000",
                                "train.rounds=1000")
        server.sampler = ClientSampler(server.sampler.section, server.sampler.seed,
                                       np.arange(20) * 3 + 5)                # unequal importances
        # CACS is unbiased in any order (T24): one that interleaves large and small clients
        server.sampler.client_order = ClientOrder(np.random.default_rng(3).permutation(20),
                                                  np.zeros(20, dtype=np.int64))
        sizes = server.sampler.client_sizes
        p = sizes / sizes.sum()
        steps = []
        for round in range(600):
            before = server.global_params().clone()
            plan = server.sample(round)
            server.step(round, plan, fake_results(server, plan.participants, lambda c, b: torch.zeros(b)))
            steps.append((server.global_params() - before)[0].item())
            # the selector's weights are the ones the algorithm aggregated with
            assert steps[-1] == pytest.approx(-sum(w * c for c, w in plan.weights.items()),
                                             abs=1e-6 * abs(before[0].item()) + 1e-4)     # float32 steps
        # fake_results uploads the vector full of the client's id
        within_4_se(np.array(steps), -(p * np.arange(len(p))).sum())


@pytest.mark.parametrize("overrides, message", [
    (["selection.selector=md", "train.round_policy=deadline", "train.deadline_s=5"], "needs train.round_policy=sync"),
    (["selection.selector=acs", "algorithm.agg_weighting=num_samples"], "does not apply with selection.selector=acs"),
    (["selection.selector=ucs", "algorithm.name=fedlalr"], "does not apply to fedlalr"),
    (["selection.ucs_variant=reference_code"], "selection.ucs_variant only applies to selection.selector=ucs"),
    (["selection.selector=oort"], "selection.selector='oort' is not one of: uniform, poisson, md, acs, ucs, cacs"),
    (["selection.cacs_clusters=5"], "selection.cacs_clusters only applies to selection.selector=cacs"),
    (["selection.selector=acs", "selection.cacs_warmup_rounds=2"], "cacs_warmup_rounds only applies to"),
    (["selection.selector=acs", "selection.ucs_variant=reference_code"], "ucs_variant only applies to"),
])
def test_undefined_combinations_are_one_line(overrides, message):
    import rayfed
    with pytest.raises(rayfed.ConfigError, match=message):
        rayfed.load_config(None, overrides)


@pytest.mark.parametrize("selector", ["md", "acs", "ucs", "cacs"])
def test_runs_with_a_selector_train_each_drawn_client_once(tmp_path, selector):
    import rayfed
    overrides = ["engine.backend=local", "data.num_clients=12", "train.clients_per_round=6", "train.rounds=5",
                 "train.eval_every=5", "model.name=logreg", "algorithm.name=fedavg", f"selection.selector={selector}"]
    result = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "run", progress=False)
    for metrics in result.history:
        assert metrics["num_participants"] == metrics["num_sampled"] <= 6
        if selector != "ucs":
            assert metrics["weight_sum"] == pytest.approx(1.0, abs=1e-12)
    again = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "again", progress=False)
    assert np.array_equal(result.params.numpy(), again.params.numpy())


# ---- CACS (§3.7, T24) ----

def clustered_gradients(group_sizes, dim=12, seed=0):
    """Clients in groups whose gradients point in one of len(group_sizes) orthogonal directions, plus noise."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(group_sizes)), group_sizes)
    gradients = np.eye(dim)[labels] * 10 + rng.normal(scale=0.5, size=(len(labels), dim))
    permutation = rng.permutation(len(labels))          # groups not contiguous in client ids
    return gradients[permutation], labels[permutation]


def test_t24_cacs_orders_clusters_by_mass_then_clients_by_importance():
    from rayfed.selection import cluster_order
    gradients, truth = clustered_gradients([6, 9, 4, 7])
    counts = np.random.default_rng(1).integers(10, 51, size=len(truth))
    found = cluster_order(gradients, counts, 4)
    order, labels = found.order, found.labels
    assert sorted(order) == list(range(len(truth)))
    # the clusters are the groups, up to naming
    assert len({(a, b) for a, b in zip(truth, labels)}) == 4
    along = labels[order]
    assert np.all(np.diff(along) >= 0)                               # clusters contiguous, numbered in order
    masses = np.bincount(labels, weights=counts)
    assert np.all(np.diff(masses) <= 0)                              # totals non-increasing along pi
    for cluster in range(4):
        members = order[along == cluster]
        assert np.all(np.diff(counts[members]) <= 0)                 # p non-increasing inside a cluster
    table = acs_table(counts, 5, order)
    assert np.allclose(table.sum(axis=0), 1, atol=1e-12) and np.allclose(table.sum(axis=1), 5 * counts / counts.sum())


def test_t24_clusters_of_mass_one_over_m_give_one_draw_per_cluster():
    from rayfed.selection import cluster_order
    gradients, truth = clustered_gradients([5, 3, 4, 2])
    counts = np.zeros(len(truth), dtype=np.int64)
    for group in range(4):                                      # every group holds exactly 60 samples
        members = np.flatnonzero(truth == group)
        counts[members] = 60 // len(members)
    found = cluster_order(gradients, counts, 4)
    table = acs_table(counts, 4, found.order)
    for draw in range(4):
        assert len(set(found.labels[np.flatnonzero(table[:, draw])])) == 1


def test_t24_cacs_draws_are_unbiased_with_the_exact_second_moment():
    from rayfed.selection import cluster_order
    gradients, _ = clustered_gradients([10, 12, 8, 10], seed=4)
    counts = random_counts(5, num_clients=40)
    order = cluster_order(gradients, counts, 5).order
    rng = np.random.default_rng(6)
    weights = np.zeros((ROUNDS // 4, 40))
    for round in range(len(weights)):
        chosen = select("cacs", np.arange(40), counts, 5, rng, order=order)
        weights[round, chosen.clients] = chosen.weights
        assert chosen.weights.sum() == pytest.approx(1.0, abs=1e-12)
    table = acs_table(counts, 5, order)
    p = counts / counts.sum()
    second_moment = (p / 5 + (5 * p) ** 2 / 25 - (table ** 2).sum(axis=1) / 25)      # Eq. (25)
    for column, expected in ((weights, p), (weights ** 2, second_moment)):
        mean = column.mean(axis=0)
        standard_error = column.std(axis=0, ddof=1) / np.sqrt(len(column))
        assert np.all(np.abs(mean - expected) <= 4 * standard_error + 1e-12)


def test_cacs_fills_the_draws_in_pi_restricted_to_the_online_clients():
    counts = np.array([10, 20, 30, 40, 50, 60])
    order = np.array([5, 0, 3, 1, 4, 2])
    online = np.array([0, 1, 3, 5])
    restricted = acs_table(counts[online], 2, np.array([3, 0, 2, 1]))      # clients 5, 0, 3, 1: pi without 4, 2
    for seed in range(20):
        chosen = select("cacs", online, counts[online], 2, np.random.default_rng(seed), order=order)
        draws = online[dense_draws(restricted, np.random.default_rng(seed))]
        assert chosen.clients.tolist() == list(dict.fromkeys(draws.tolist()))


def test_mifa_under_a_selector_averages_every_clients_latest_update_by_importance():
    import torch

    from rayfed.algorithms.base import RoundInfo
    from tests.fakes import NUM_CLIENTS, SCHEDULE, client, make
    counts = np.arange(NUM_CLIENTS) + 3
    p = counts / counts.sum()
    mifa = make("mifa", lr_local=0.05, lr_global=1.0)
    state = mifa.server_init(torch.zeros(5), NUM_CLIENTS)
    latest = {}
    for round, sampled in enumerate(SCHEDULE):
        uploads = {}
        for i in sorted(sampled):
            upload, latest[i] = mifa.client_train(client(i), mifa.broadcast(state), latest.get(i))
            uploads[i] = upload
        weights = {i: 1.0 / len(sampled) for i in sampled}
        state, _ = mifa.server_step(state, uploads, RoundInfo(round, tuple(sampled), NUM_CLIENTS, weights,
                                                              {i: float(p[i]) for i in sampled}))
        expected = sum(float(p[i]) * latest[i].latest_model_change for i in latest)
        torch.testing.assert_close(state.average, expected)


def test_mifa_runs_under_every_selector(tmp_path):
    import rayfed
    for selector in ("md", "acs", "ucs"):
        overrides = ["engine.backend=local", "data.num_clients=12", "train.clients_per_round=4", "train.rounds=3",
                     "train.eval_every=3", "model.name=logreg", "algorithm.name=mifa", f"selection.selector={selector}"]
        result = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / selector, progress=False)
        assert np.isfinite(result.history[-1]["test_loss"])


def test_md_draws_numpys_categorical_choice_and_a_kept_cumulative_sum_changes_no_draw():
    """md searches the importances' cumulative sum that numpy's choice(p=...) forms, so its draws are choice's;
    the sampler keeps all clients' sum between rounds, read-only, and a round drawn from the kept one equals a
    fresh one."""
    from rayfed.selection.sampler import ClientSampler
    from rayfed.selection.selectors import Importances
    from rayfed.systems.availability import AllClients
    for seed in range(20):
        counts = np.random.default_rng(seed).integers(0 if seed % 2 else 1, 30, size=1 + 97 * seed)
        p = counts / counts.sum()
        expected = np.random.default_rng(seed).choice(len(counts), size=25, replace=True, p=p)
        first = np.unique(expected, return_index=True)[1]
        selection = select("md", np.arange(len(counts)), counts, 25, np.random.default_rng(seed))
        assert np.array_equal(selection.clients, expected[np.sort(first)])
        kept_importances = Importances(counts)
        for rng_seed in (seed, seed + 1):
            kept = select("md", AllClients(len(counts)), counts, 25, np.random.default_rng(rng_seed),
                          kept_importances=kept_importances)
            fresh = select("md", np.arange(len(counts)), counts, 25, np.random.default_rng(rng_seed))
            assert np.array_equal(kept.clients, fresh.clients) and np.array_equal(kept.weights, fresh.weights)
    with pytest.raises(ValueError, match=r"the candidates' importances do not form a distribution \(their sum is nan\)"), \
            np.errstate(invalid="ignore"):
        select("md", np.arange(3), np.zeros(3, dtype=np.int64), 2, np.random.default_rng(0))
    sizes = np.random.default_rng(3).integers(1, 1000, size=500).astype(np.int32)
    sampler = ClientSampler(None, 0, sizes)
    assert sampler.importances([0, 7, 499]) == {client: float(sizes[client] / sizes.sum()) for client in (0, 7, 499)}
    for kept in (sampler.kept_importances.p, sampler.kept_importances.cumulative):
        with pytest.raises(ValueError, match="read-only"):
            kept[0] = 0.5

