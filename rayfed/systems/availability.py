"""Which clients are online at a round and virtual time: always, Bernoulli per round, on/off Markov, or a trace.

Every model answers with a pure function of (seed, client, round or time): the server's round
policy decides at which virtual times it asks, and two policies must see the same realisation
for their runs to be comparable. All state is arrays over clients, so 100 000 clients stay cheap.
"""
from enum import IntEnum
import math
import pathlib
from typing import Protocol

import numpy as np

from rayfed.config import AVAILABILITIES
from rayfed.errors import ConfigError
from rayfed.systems.counter_random import ClientUniforms, uniform, uniform_thresholds
from rayfed.systems.csv_rows import parse_client_id, parse_number, read_rows

TRACE_HEADER = "client_id,start,end"


class Stream(IntEnum):
    """One stream number per use of randomness here, so that no two uses ever share draws."""
    BERNOULLI_ONLINE = 1
    BERNOULLI_PROBABILITIES = 2
    MARKOV = 3


class Availability(Protocol):
    def online(self, round: int, time_s: float) -> np.ndarray:
        """bool (num_clients,): True for the clients online at round `round`, virtual time `time_s`."""


class AllClients:
    """Clients 0 .. count - 1, the candidates of a round where everyone is online, without the array
    of their ids (80 MB at N = 10^7, each round): it has a length, gives the ids at positions, and
    becomes that array only for code that asks numpy for one."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, positions) -> np.ndarray:
        return np.arange(self.count, dtype=np.int64)[positions] if isinstance(positions, slice) else (
            _positions(np.asarray(positions), self.count))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.arange(self.count, dtype=dtype or np.int64)


def _positions(positions: np.ndarray, count: int) -> np.ndarray:
    """What np.arange(count)[positions] is, for integer or boolean positions."""
    if positions.dtype == bool:
        if positions.shape != (count,):
            raise IndexError(f"a boolean index of shape {positions.shape} for {count} clients")
        return np.flatnonzero(positions)
    if positions.size and not (-count <= positions.min() and positions.max() < count):
        raise IndexError(f"client positions outside 0 .. {count - 1}")
    return np.where(positions < 0, positions + count, positions).astype(np.int64)


class AlwaysOnline:
    def __init__(self, num_clients: int):
        self.num_clients = num_clients

    def online(self, round: int, time_s: float) -> np.ndarray:
        return np.ones(self.num_clients, dtype=bool)


class BernoulliOnline:
    """Client i is online at each round independently with its own p_i ~ Beta(p c, (1 - p) c).

    The Beta spreads reliability over clients around the mean p: large c makes clients alike,
    small c splits them into nearly-always and nearly-never online.
    """

    def __init__(self, num_clients: int, seed: int, probability: float, concentration: float):
        self.uniforms = ClientUniforms(seed, Stream.BERNOULLI_ONLINE, np.arange(num_clients, dtype=np.uint64))
        # Each round compares every client's draw with its p_i: as integers, in cache-sized blocks, 2-4x faster than as
        # floats.
        self.thresholds = uniform_thresholds(online_probabilities(num_clients, seed, probability, concentration))

    def online(self, round: int, time_s: float) -> np.ndarray:
        """uniform(seed, BERNOULLI_ONLINE, i, round) < p_i for every client i."""
        return self.uniforms.below(round, self.thresholds)


def online_probabilities(num_clients: int, seed: int, probability: float, concentration: float) -> np.ndarray:
    """The clients' p_i of BernoulliOnline."""
    if probability == 1:
        # Beta(c, 0) is undefined; its limit is a point mass at 1.
        return np.ones(num_clients)
    rng = np.random.default_rng([seed, int(Stream.BERNOULLI_PROBABILITIES)])
    return rng.beta(probability * concentration, (1 - probability) * concentration, size=num_clients)


class MarkovOnline:
    """Each client alternates exponential on and off periods in virtual seconds, starting in the stationary law.

    Client i's k-th period lasts -mean * log(uniform(seed, MARKOV, i, k + 1)), so its switch times are
    fixed by the seed alone; the arrays below only cache how far along them each client has been walked.
    """

    def __init__(self, num_clients: int, seed: int, mean_online_s: float, mean_offline_s: float):
        self.seed = seed
        self.mean_online_s = mean_online_s
        self.mean_offline_s = mean_offline_s
        self.client_ids = np.arange(num_clients, dtype=np.uint64)
        self._rewind()

    def _rewind(self) -> None:
        """Back to the state at time 0, with each client's first period drawn."""
        stationary_online = self.mean_online_s / (self.mean_online_s + self.mean_offline_s)
        self.is_online = uniform(self.seed, Stream.MARKOV, self.client_ids, 0) < stationary_online
        self.periods_drawn = np.zeros(len(self.client_ids), dtype=np.int64)
        self.period_ends_s = np.zeros(len(self.client_ids))
        self._start_next_period(np.arange(len(self.client_ids)))
        self.latest_query_s = -math.inf

    def _start_next_period(self, clients: np.ndarray) -> None:
        means = np.where(self.is_online[clients], self.mean_online_s, self.mean_offline_s)
        draws = uniform(self.seed, Stream.MARKOV, self.client_ids[clients], self.periods_drawn[clients] + 1)
        self.period_ends_s[clients] += -means * np.log(draws)
        self.periods_drawn[clients] += 1

    def online(self, round: int, time_s: float) -> np.ndarray:
        # The cached periods can only be walked forwards; an earlier time replays them from 0,
        # and the sums come out bit-identical because they are added in the same order.
        if time_s < self.latest_query_s:
            self._rewind()
        self.latest_query_s = time_s
        switching = np.flatnonzero(self.period_ends_s <= time_s)
        while switching.size:
            self.is_online[switching] = ~self.is_online[switching]
            self._start_next_period(switching)
            switching = switching[self.period_ends_s[switching] <= time_s]
        return self.is_online.copy()


class TraceOnline:
    """Online intervals [start, end) read from a CSV in FedScale's layout; clients not listed are never online."""

    def __init__(self, num_clients: int, path: str | pathlib.Path):
        self.num_clients = num_clients
        clients, starts, ends = read_trace(path, num_clients)
        # Sorted by start, the intervals begun by time t are a prefix found by binary search.
        order = np.argsort(starts, kind="stable")
        self.interval_clients = clients[order]
        self.interval_starts = starts[order]
        self.interval_ends = ends[order]

    def online(self, round: int, time_s: float) -> np.ndarray:
        begun = np.searchsorted(self.interval_starts, time_s, side="right")
        online = np.zeros(self.num_clients, dtype=bool)
        online[self.interval_clients[:begun][self.interval_ends[:begun] > time_s]] = True
        return online


def read_trace(path: str | pathlib.Path, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(client ids, starts, ends) of every interval in the file; ConfigError naming the line of the first bad one."""
    clients, starts, ends = [], [], []
    for where, fields in read_rows(path, "systems.trace", TRACE_HEADER, "intervals"):
        client_id = parse_client_id(fields[0], num_clients, where)
        start = parse_number(fields[1], "start", "seconds", where)
        end = parse_number(fields[2], "end", "seconds", where)
        if start < 0:
            raise ConfigError(f"{where}: start={start} is negative; virtual time begins at 0")
        if not end > start:
            raise ConfigError(f"{where}: end={end} must be greater than start={start} (intervals are [start, end))")
        clients.append(client_id)
        starts.append(start)
        ends.append(end)
    return np.array(clients, dtype=np.int64), np.array(starts), np.array(ends)


def make_availability(kind: str, num_clients: int, seed: int, *, probability: float = 0.8,
                      concentration: float = 10.0, mean_online_s: float = 600.0, mean_offline_s: float = 600.0,
                      trace: str | pathlib.Path | None = None) -> Availability:
    """Check the parameters `kind` uses (ConfigError otherwise), then build its model."""
    if kind not in AVAILABILITIES:
        raise ConfigError(f"systems.availability={kind!r} is not one of {', '.join(AVAILABILITIES)}")
    if num_clients < 1:
        raise ConfigError(f"data.num_clients={num_clients} must be at least 1")
    if seed < 0:
        raise ConfigError(f"seed={seed} must be >= 0")

    if kind == "always":
        return AlwaysOnline(num_clients)
    if kind == "bernoulli":
        if not 0 < probability <= 1:
            raise ConfigError(f"systems.online_probability={probability} must be in (0, 1]")
        if not 0 < concentration < math.inf:
            raise ConfigError(f"systems.online_concentration={concentration} must be a finite number > 0")
        return BernoulliOnline(num_clients, seed, probability, concentration)
    if kind == "markov":
        for key, mean in (("mean_online_s", mean_online_s), ("mean_offline_s", mean_offline_s)):
            if not 0 < mean < math.inf:
                raise ConfigError(f"systems.{key}={mean} must be a finite number of seconds > 0")
        return MarkovOnline(num_clients, seed, mean_online_s, mean_offline_s)
    if trace is None:
        raise ConfigError("systems.availability=trace needs systems.trace, the path of a "
                          f"{TRACE_HEADER} CSV of online intervals")
    return TraceOnline(num_clients, trace)
