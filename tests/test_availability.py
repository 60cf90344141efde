import csv
import math
import pathlib

import numpy as np
import pytest

from rayfed.errors import ConfigError
from rayfed.systems import AlwaysOnline, BernoulliOnline, MarkovOnline, TraceOnline, make_availability
from rayfed.systems import counter_random
from rayfed.systems.availability import Stream, online_probabilities
from rayfed.systems.counter_random import ClientUniforms, _open_unit_interval, uniform, uniform_thresholds

EXAMPLE_TRACE = pathlib.Path(__file__).parents[1] / "experiments" / "systems" / "example_trace.csv"
EXAMPLE_CLIENTS = 20
EXAMPLE_NEVER_ONLINE = 13


def ks_statistic(draws: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance between the empirical CDF of `draws` and the uniform CDF on (0, 1)."""
    ordered = np.sort(draws)
    n = len(ordered)
    above = np.arange(1, n + 1) / n - ordered
    below = ordered - np.arange(n) / n
    return float(max(above.max(), below.max()))


def ks_critical(n: int) -> float:
    """The 0.1% critical value of the KS statistic for large n."""
    return 1.95 / math.sqrt(n)


# counter_random

def test_uniform_is_a_pure_function_of_its_coordinates():
    clients = np.arange(1000)
    np.testing.assert_array_equal(uniform(7, 3, clients, 42), uniform(7, 3, clients, 42))
    # One element asked alone equals the same element asked in a batch.
    assert uniform(7, 3, 517, 42) == uniform(7, 3, clients, 42)[517]


@pytest.mark.parametrize("other", [dict(seed=8), dict(stream=4), dict(counter=43)])
def test_uniform_changes_with_seed_stream_and_counter(other):
    clients = np.arange(10_000)
    base = dict(seed=7, stream=3, counter=42)
    changed = {**base, **other}
    first = uniform(base["seed"], base["stream"], clients, base["counter"])
    second = uniform(changed["seed"], changed["stream"], clients, changed["counter"])
    assert not np.any(first == second)
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.05


def test_uniform_changes_with_client():
    draws = uniform(7, 3, np.arange(100_000), 0)
    assert len(np.unique(draws)) == len(draws)


def test_no_two_client_counter_pairs_share_a_draw():
    # A hash of client + counter, say, would pass every per-axis test yet repeat along diagonals.
    grid = uniform(7, 3, np.arange(300)[:, None], np.arange(300))
    assert len(np.unique(grid)) == grid.size


def test_uniform_broadcasts_clients_against_counters():
    grid = uniform(1, 2, np.arange(5)[:, None], np.arange(4))
    assert grid.shape == (5, 4)
    assert grid[3, 2] == uniform(1, 2, 3, 2)
    np.testing.assert_array_equal(grid[:, 1], uniform(1, 2, np.arange(5), 1))


@pytest.mark.parametrize("seed, stream", [(0, 0), (7, 3), (2**63 + 5, 2**40)])
def test_client_uniforms_are_uniform_one_counter_at_a_time(seed, stream):
    """Bernoulli availability draws every client each round through ClientUniforms: the same floats."""
    clients = np.array([0, 1, 17, 999_999, 2**40], dtype=np.uint64)
    uniforms = ClientUniforms(seed, stream, clients)
    for counter in (0, 1, 5, 1000, 2**40):
        np.testing.assert_array_equal(uniforms.at(counter), uniform(seed, stream, clients, counter))


def test_the_integer_thresholds_compare_as_the_draws_do():
    """k < uniform_thresholds(p) exactly when the draw with top bits k, (k + 0.5) / 2**52, is below p: at p equal
    to a draw, one float either side of it, at 0, 1 and subnormals, and at random p."""
    rng = np.random.default_rng(0)
    tops = np.concatenate([[0, 1, 2, 2**51, 2**52 - 2, 2**52 - 1], rng.integers(0, 2**52, 200)]).astype(np.uint64)
    draws = _open_unit_interval(tops << np.uint64(12))
    probabilities = np.concatenate([draws, np.nextafter(draws, 0), np.nextafter(draws, 1), rng.random(200),
                                    [0.0, 5e-324, 2.0**-60, 2.0**-54, 2.0**-53, 2.0**-52, 0.3, 1.0]])
    thresholds = uniform_thresholds(probabilities)
    assert thresholds.dtype == np.uint64
    np.testing.assert_array_equal(tops[:, None] < thresholds[None, :], draws[:, None] < probabilities[None, :])


@pytest.mark.parametrize("counter", [0, 1, 2**40])
def test_below_answers_as_the_floats_block_by_block(counter):
    """ClientUniforms.below, hashed a block at a time in place, gives at(counter) < p: over three blocks and a
    part, with p at some clients' own draws (not below) and one float above them (below)."""
    count = 3 * counter_random._BLOCK + 17
    uniforms = ClientUniforms(5, 1, np.arange(count, dtype=np.uint64))
    draws = uniforms.at(counter)
    probabilities = np.random.default_rng(counter).beta(2.0, 3.0, count)
    probabilities[::7], probabilities[3::7] = draws[::7], np.nextafter(draws[3::7], 1)
    expected = draws < probabilities
    np.testing.assert_array_equal(uniforms.below(counter, uniform_thresholds(probabilities)), expected)
    assert not expected[::7].any() and expected[3::7].all()
    with pytest.raises(ValueError, match=f"below takes uniform_thresholds of the {count} clients, not float64"):
        uniforms.below(counter, probabilities)


@pytest.mark.parametrize("clients, counters", [
    (np.arange(100_000), 9),                     # across clients
    (12345, np.arange(100_000)),                 # along one client's counters
    (np.arange(400)[:, None], np.arange(250)),   # a grid of both
])
def test_uniform_is_uniform(clients, counters):
    draws = uniform(2024, 5, clients, counters).ravel()
    n = len(draws)
    assert n == 100_000
    assert np.all((draws > 0) & (draws < 1))
    assert abs(draws.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    # The variance estimator of U(0,1) has variance (1/80 - 1/144) / n.
    assert abs(draws.var() - 1 / 12) < 5 * math.sqrt((1 / 80 - 1 / 144) / n)
    assert ks_statistic(draws) < ks_critical(n)


def test_successive_counters_are_uncorrelated():
    draws = uniform(0, 1, 3, np.arange(100_000))
    assert abs(np.corrcoef(draws[:-1], draws[1:])[0, 1]) < 5 / math.sqrt(len(draws))


def test_extreme_hash_values_stay_inside_the_open_interval():
    extremes = _open_unit_interval(np.array([0, 1, 2**64 - 1], dtype=np.uint64))
    assert np.all(extremes > 0) and np.all(extremes < 1)
    assert np.all(np.isfinite(-np.log(extremes)))


# always

def test_always_online():
    model = AlwaysOnline(7)
    for round, time_s in [(0, 0.0), (5, 123.4), (10_000, 1e9)]:
        online = model.online(round, time_s)
        assert online.dtype == bool and online.shape == (7,) and online.all()


# bernoulli

def test_bernoulli_is_deterministic_per_seed_and_round_whatever_was_asked_before():
    first, second = BernoulliOnline(500, 3, 0.6, 5.0), BernoulliOnline(500, 3, 0.6, 5.0)
    asked_late = [first.online(round, 0.0) for round in range(10)][7]
    np.testing.assert_array_equal(second.online(7, 99.0), asked_late)
    np.testing.assert_array_equal(first.thresholds, second.thresholds)
    # The definition: client i is online at round r when its uniform draw for r is below its p_i.
    definition = uniform(3, Stream.BERNOULLI_ONLINE, np.arange(500), 7) < online_probabilities(500, 3, 0.6, 5.0)
    np.testing.assert_array_equal(asked_late, definition)


def test_bernoulli_differs_across_rounds_and_seeds():
    model = BernoulliOnline(1000, 3, 0.6, 5.0)
    assert not np.array_equal(model.online(0, 0.0), model.online(1, 0.0))
    assert not np.array_equal(model.online(0, 0.0), BernoulliOnline(1000, 4, 0.6, 5.0).online(0, 0.0))
    assert not np.array_equal(online_probabilities(1000, 3, 0.6, 5.0), online_probabilities(1000, 4, 0.6, 5.0))


def test_bernoulli_frequencies_follow_each_clients_probability():
    num_rounds = 2000
    model = BernoulliOnline(200, 11, 0.7, 4.0)
    frequency = np.mean([model.online(round, 0.0) for round in range(num_rounds)], axis=0)
    p = online_probabilities(200, 11, 0.7, 4.0)
    binomial_std = np.sqrt(p * (1 - p) / num_rounds)
    assert np.all(np.abs(frequency - p) <= 5 * binomial_std + 1e-12)
    # Clients do differ: the test above is not passing on p_i all alike.
    assert p.std() > 0.1


def test_bernoulli_probabilities_average_to_the_configured_mean():
    probability, concentration, num_clients = 0.8, 10.0, 20_000
    p = online_probabilities(num_clients, 0, probability, concentration)
    beta_variance = probability * (1 - probability) / (concentration + 1)
    assert abs(p.mean() - probability) < 5 * math.sqrt(beta_variance / num_clients)
    assert p.var() == pytest.approx(beta_variance, rel=0.05)


def test_bernoulli_probability_one_keeps_everyone_online():
    model = BernoulliOnline(1000, 0, 1.0, 10.0)
    assert all(model.online(round, 0.0).all() for round in range(50))


# markov

def markov_reference(seed: int, client: int, time_s: float, mean_online_s: float, mean_offline_s: float) -> bool:
    """The definition, walked one period at a time for one client."""
    is_online = uniform(seed, Stream.MARKOV, client, 0) < mean_online_s / (mean_online_s + mean_offline_s)
    period_end, periods = 0.0, 0
    while True:
        mean = mean_online_s if is_online else mean_offline_s
        period_end += -mean * math.log(uniform(seed, Stream.MARKOV, client, periods + 1))
        periods += 1
        if period_end > time_s:
            return bool(is_online)
        is_online = not is_online


def test_markov_matches_the_one_client_definition():
    model = MarkovOnline(50, 9, 300.0, 700.0)
    for time_s in [0.0, 10.0, 999.5, 4321.0, 20_000.0]:
        expected = [markov_reference(9, client, time_s, 300.0, 700.0) for client in range(50)]
        np.testing.assert_array_equal(model.online(0, time_s), expected)


def test_markov_long_run_fraction_online():
    mean_online_s, mean_offline_s = 300.0, 900.0
    model = MarkovOnline(2000, 1, mean_online_s, mean_offline_s)
    expected = mean_online_s / (mean_online_s + mean_offline_s)
    # Samples 1000 s apart are nearly independent: the chain forgets in ~1 / (1/300 + 1/900) = 225 s.
    samples = np.array([model.online(0, time_s) for time_s in np.arange(0.0, 50_000.0, 1000.0)])
    assert abs(samples.mean() - expected) < 0.01
    # The first state already follows the stationary law.
    assert abs(samples[0].mean() - expected) < 5 * math.sqrt(expected * (1 - expected) / 2000)


def completed_run_lengths(states: np.ndarray, value: bool) -> np.ndarray:
    """Lengths in samples of the runs of `value` along axis 0, leaving out runs cut by either end."""
    lengths = []
    for column in states.T:
        changes = np.flatnonzero(np.diff(column.astype(np.int8))) + 1
        for begin, end in zip(changes[:-1], changes[1:]):
            if column[begin] == value:
                lengths.append(end - begin)
    return np.array(lengths)


def test_markov_mean_period_lengths():
    mean_online_s, mean_offline_s, step_s = 300.0, 500.0, 10.0
    model = MarkovOnline(300, 2, mean_online_s, mean_offline_s)
    states = np.array([model.online(round, time_s) for round, time_s in enumerate(np.arange(0.0, 40_000.0, step_s))])
    on_lengths = completed_run_lengths(states, True) * step_s
    off_lengths = completed_run_lengths(states, False) * step_s
    assert len(on_lengths) > 1000 and len(off_lengths) > 1000
    assert on_lengths.mean() == pytest.approx(mean_online_s, rel=0.1)
    assert off_lengths.mean() == pytest.approx(mean_offline_s, rel=0.1)


def test_markov_answer_does_not_depend_on_the_query_history():
    times = [123.4, 5000.0, 20_000.0]

    def fresh():
        return MarkovOnline(1000, 5, 400.0, 600.0)

    increasing = fresh()
    answers = {time_s: increasing.online(round, time_s) for round, time_s in enumerate(times)}
    np.testing.assert_array_equal(fresh().online(0, times[2]), answers[times[2]])
    shuffled = fresh()
    for time_s in [times[2], times[0], 7777.0, times[1], times[0], times[2]]:
        answer = shuffled.online(0, time_s)
        if time_s in answers:
            np.testing.assert_array_equal(answer, answers[time_s])
    assert 0 < answers[times[2]].mean() < 1


def test_markov_answer_is_a_copy():
    model = MarkovOnline(10, 0, 100.0, 100.0)
    first = model.online(0, 50.0)
    first[:] = ~first
    assert not np.array_equal(model.online(0, 50.0), first)


# trace

def read_intervals(path: pathlib.Path) -> list[tuple[int, float, float]]:
    with open(path, newline="") as handle:
        return [(int(row["client_id"]), float(row["start"]), float(row["end"])) for row in csv.DictReader(handle)]


def brute_force_online(intervals, num_clients: int, time_s: float) -> np.ndarray:
    online = np.zeros(num_clients, dtype=bool)
    for client, start, end in intervals:
        if start <= time_s < end:
            online[client] = True
    return online


def check_against_brute_force(model: TraceOnline, intervals, num_clients: int) -> None:
    boundaries = [time for _, start, end in intervals for time in (start, end)]
    nudged = [time + shift for time in boundaries for shift in (-1e-6, 1e-6)]
    times = [*boundaries, *nudged, *np.linspace(-10.0, 4000.0, 401)]
    for round, time_s in enumerate(sorted(times)):
        np.testing.assert_array_equal(model.online(round, time_s), brute_force_online(intervals, num_clients, time_s),
                                      err_msg=f"at time {time_s}")


def test_example_trace_matches_brute_force():
    intervals = read_intervals(EXAMPLE_TRACE)
    model = TraceOnline(EXAMPLE_CLIENTS, EXAMPLE_TRACE)
    check_against_brute_force(model, intervals, EXAMPLE_CLIENTS)
    ever_online = np.any([model.online(0, time_s) for time_s in np.arange(0.0, 3600.0, 10.0)], axis=0)
    assert not ever_online[EXAMPLE_NEVER_ONLINE]
    assert ever_online.sum() == EXAMPLE_CLIENTS - 1


def test_trace_with_touching_and_overlapping_intervals(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("client_id,start,end\n2,100,200\n0,0,50\n2,200,300\n1,10,400\n1,20,30\n0,60.5,70\n\n")
    intervals = read_intervals(path)[:6]
    model = TraceOnline(4, path)
    check_against_brute_force(model, intervals, 4)
    # [100, 200) then [200, 300): online right through the shared boundary.
    assert model.online(0, 200.0)[2] and not model.online(0, 300.0)[2]


def write_lines(path: pathlib.Path, *lines: str) -> pathlib.Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("lines, line_number, fragment", [
    (["client_id,begin,end", "0,0,10"], 1, "header"),
    (["client_id,start,end", "0,0,10", "1,5"], 3, "2 fields"),
    (["client_id,start,end", "0,0,10,3"], 2, "4 fields"),
    (["client_id,start,end", "zero,0,10"], 2, "'zero' is not a whole number"),
    (["client_id,start,end", "1.5,0,10"], 2, "'1.5' is not a whole number"),
    (["client_id,start,end", "-1,0,10"], 2, "negative"),
    (["client_id,start,end", "0,0,10", "3,soon,10"], 3, "start 'soon' is not a number"),
    (["client_id,start,end", "0,0,later"], 2, "end 'later' is not a number"),
    (["client_id,start,end", "0,nan,10"], 2, "start 'nan' is not a finite"),
    (["client_id,start,end", "0,0,inf"], 2, "end 'inf' is not a finite"),
    (["client_id,start,end", "0,10,10"], 2, "end=10.0 must be greater than start=10.0"),
    (["client_id,start,end", "0,0,10", "", "0,20,15"], 4, "must be greater than start"),
    (["client_id,start,end", "0,-0.5,10"], 2, "start=-0.5 is negative"),
    (["client_id,start,end"], 2, "no intervals"),
])
def test_malformed_trace_names_file_and_line(tmp_path, lines, line_number, fragment):
    path = write_lines(tmp_path / "bad.csv", *lines)
    with pytest.raises(ConfigError) as caught:
        TraceOnline(4, path)
    message = str(caught.value)
    assert str(path) in message and f"line {line_number}:" in message and fragment in message
    assert "\n" not in message


def test_empty_trace_file(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.csv line 1: the file is empty"):
        TraceOnline(4, path)


def test_missing_trace_file(tmp_path):
    path = tmp_path / "absent.csv"
    with pytest.raises(ConfigError, match=r"systems\.trace=.*absent\.csv does not exist"):
        TraceOnline(4, path)


def test_trace_client_beyond_num_clients(tmp_path):
    path = write_lines(tmp_path / "big.csv", "client_id,start,end", "0,0,10", "4,0,10")
    with pytest.raises(ConfigError, match=r"big\.csv line 3: client_id 4 exceeds data\.num_clients=4"):
        TraceOnline(4, path)
    with pytest.raises(ConfigError, match=r"data\.num_clients=10"):
        TraceOnline(10, EXAMPLE_TRACE)


# make_availability

@pytest.mark.parametrize("kind, expected_type", [
    ("always", AlwaysOnline), ("bernoulli", BernoulliOnline), ("markov", MarkovOnline), ("trace", TraceOnline),
])
def test_make_availability_builds_each_kind(kind, expected_type):
    model = make_availability(kind, EXAMPLE_CLIENTS, 0, trace=EXAMPLE_TRACE)
    assert isinstance(model, expected_type)
    online = model.online(3, 1800.0)
    assert online.dtype == bool and online.shape == (EXAMPLE_CLIENTS,)


@pytest.mark.parametrize("kind, overrides, key", [
    ("sometimes", {}, "systems.availability"),
    ("bernoulli", dict(probability=0.0), "systems.online_probability"),
    ("bernoulli", dict(probability=-0.2), "systems.online_probability"),
    ("bernoulli", dict(probability=1.5), "systems.online_probability"),
    ("bernoulli", dict(probability=math.nan), "systems.online_probability"),
    ("bernoulli", dict(concentration=0.0), "systems.online_concentration"),
    ("bernoulli", dict(concentration=math.inf), "systems.online_concentration"),
    ("markov", dict(mean_online_s=0.0), "systems.mean_online_s"),
    ("markov", dict(mean_online_s=math.nan), "systems.mean_online_s"),
    ("markov", dict(mean_offline_s=-60.0), "systems.mean_offline_s"),
    ("markov", dict(mean_offline_s=math.inf), "systems.mean_offline_s"),
    ("trace", dict(trace=None), "systems.trace"),
    ("trace", dict(trace="/nonexistent/trace.csv"), "systems.trace"),
    ("always", dict(num_clients=0), "data.num_clients"),
    ("markov", dict(seed=-1), "seed"),
])
def test_make_availability_rejects_bad_parameters(kind, overrides, key):
    arguments = {"num_clients": 10, "seed": 0, **overrides}
    with pytest.raises(ConfigError) as caught:
        make_availability(kind, arguments.pop("num_clients"), arguments.pop("seed"), **arguments)
    assert str(caught.value).startswith(f"{key}=") or f" {key}" in str(caught.value)
