"""The selectors (FedMoS, Wang et al., INFOCOM 2023, Sec. IV): each returns the round's distinct clients and, except
`uniform`, their aggregation weights. Importances are the candidates' sample counts,
p_i = D_i / sum_j D_j over the clients that can be selected (the online ones).

    uniform  S clients uniformly without replacement; the algorithm weights them itself (today's sampling)
    poisson  each candidate independently with probability q = S / (candidates); the algorithm weights them
             itself (the sampling that differential privacy's Poisson-subsampled accounting describes)
    md       M i.i.d. draws ~ Cat(p);                        w_i = c_i / M (c_i: times drawn)
    acs      draw m ~ Cat(Q[:, m]) of Algorithm 2's table;    w_i = c_i / M
    cacs     acs with the table filled in the clusters' order (clusters.py) instead of by importance
    ucs      M clients uniformly without replacement;        w_i = (N / M) p_i (Eq. 28; sum w is 1 on average)
    ucs with variant reference_code: M clients without replacement with probabilities p, w_i = p_i / sum_S p_j

A client drawn more than once trains once and carries its count in its weight.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from rayfed.config import UCS_VARIANTS
from rayfed.errors import ConfigError
from rayfed.registry import SELECTORS
from rayfed.selection.table import acs_columns


@dataclass(frozen=True)
class Selection:
    """What a selector returns: the round's clients and their weights."""

    clients: np.ndarray
    """Distinct client ids, in the order first drawn."""
    weights: np.ndarray | None
    """The aggregation weight of each of `clients` (RoundInfo.weights); None: the algorithm's own."""


class Importances:
    """The importances p_i = D_i / sum_j D_j of candidates whose sample counts are `counts`, and their cumulative
    sum, each computed when first asked for and read-only (the sampler keeps all clients' for the run: a selector
    that wrote into them would change every later round's draws). Kept, a round in which every client is online
    draws md's clients in O(S), not O(N)."""

    def __init__(self, counts: np.ndarray):
        self.counts = counts

    @functools.cached_property
    def p(self) -> np.ndarray:
        return _read_only(np.asarray(self.counts, dtype=np.float64) / np.sum(self.counts))

    @functools.cached_property
    def cumulative(self) -> np.ndarray:
        """p's cumulative sum over its last entry: numpy's own for choice(p=p), whose draws searching it gives."""
        cumulative = self.p.cumsum()
        if not cumulative[-1] > 0:
            # numpy's choice refuses such p too; searching it would pick a client of no mass
            raise ValueError(f"the candidates' importances do not form a distribution (their sum is {cumulative[-1]})")
        cumulative /= cumulative[-1]
        return _read_only(cumulative)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class SelectionRequest:
    """One round's draw, what a selector is given."""

    candidates: np.ndarray
    """The online clients' ids (none when nobody is online)."""
    counts: np.ndarray
    """The candidates' sample counts D_i."""
    size: int
    """The draws to make: S (the FedMoS paper's M)."""
    rng: np.random.Generator
    """The stream to draw from: (seed, round)."""
    ucs_variant: str = "paper"
    """selection.ucs_variant, for UCS."""
    order: np.ndarray | None = None
    """CACS's order of all clients, from its warm-up; None for the other selectors."""
    kept_importances: Importances | None = None
    """The candidates' Importances, which rayfed's sampler keeps between rounds while every client is
    online; a selector reads them as `importances` and `cumulative_importances`."""

    @property
    def importances(self) -> np.ndarray:
        """p_i = D_i / sum_j D_j over the candidates."""
        return self._importances().p

    @property
    def cumulative_importances(self) -> np.ndarray:
        """The cumulative sum of p over its last entry, as numpy's choice(p=p) forms it."""
        return self._importances().cumulative

    def _importances(self) -> Importances:
        return self.kept_importances if self.kept_importances is not None else Importances(self.counts)


def register_selector(name: str, *, warmup: bool = False, unit_weight_sum: bool = True, weighted: bool = True):
    """Registers a selector `(SelectionRequest) -> Selection` under `name` (rayfed.register_selector):
    selection.selector then uses it. `warmup`: it orders the clients from a warm-up before round 0
    (CACS's); `unit_weight_sum`: its weights sum to 1 in every round (not only on average), which
    algorithms that average models need; `weighted`: it gives aggregation weights (False: its
    Selection's weights are None, and the algorithm weights the clients itself, as with uniform)."""
    def decorate(selector):
        if not callable(selector):
            raise ConfigError(f"register_selector({name!r}) takes a function (SelectionRequest) -> Selection")
        return SELECTORS.register(name, warmup=warmup, unit_weight_sum=unit_weight_sum, weighted=weighted)(selector)
    return decorate


def select(selector: str, candidates: np.ndarray, counts: np.ndarray, size: int, rng: np.random.Generator,
           ucs_variant: str = "paper", order: np.ndarray | None = None,
           kept_importances: Importances | None = None) -> Selection:
    """The round's selection by the registered `selector` (see SelectionRequest). rayfed's own
    selectors take the candidates as given (AllClients when everyone is online: they only index it);
    a plugin's get the array of ids its API promises."""
    entry = SELECTORS.get(selector)
    return entry.target(SelectionRequest(candidates if entry.builtin else np.asarray(candidates), counts, size, rng,
                                         ucs_variant, order, kept_importances))


@register_selector("uniform", weighted=False)
def _uniform(request: SelectionRequest) -> Selection:
    candidates = request.candidates
    return Selection(candidates[request.rng.choice(len(candidates), size=min(request.size, len(candidates)),
                                                   replace=False)], None)


@register_selector("poisson", weighted=False)
def _poisson(request: SelectionRequest) -> Selection:
    # A Binomial(n, q) count, then that many candidates uniformly without replacement: the law of n independent
    # Bernoulli(q) draws, in O(S) rather than O(n) a round.
    candidates = request.candidates
    q = min(request.size / len(candidates), 1.0) if len(candidates) else 0.0
    count = int(request.rng.binomial(len(candidates), q))
    return Selection(candidates[np.sort(request.rng.choice(len(candidates), size=count, replace=False))], None)


def _nobody_without_candidates(selector):
    """A selector that weights its draws, given no candidates (nobody online): it draws nobody and gives no weights,
    as `uniform` does, and the server waits (rayfed.systems.clock)."""
    @functools.wraps(selector)
    def draw(request: SelectionRequest) -> Selection:
        if len(request.candidates) == 0:
            return Selection(np.empty(0, dtype=np.int64), np.empty(0))
        return selector(request)
    return draw


@register_selector("md")
@_nobody_without_candidates
def _md(request: SelectionRequest) -> Selection:
    # numpy's choice(len(candidates), size, p=importances), draw for draw, without its pass over p every round
    draws = np.searchsorted(request.cumulative_importances, request.rng.random(request.size), side="right")
    return _counted(request, draws)


@register_selector("acs")
@_nobody_without_candidates
def _acs(request: SelectionRequest) -> Selection:
    return _counted(request, _draw_columns(acs_columns(request.counts, request.size), request.rng))


@register_selector("ucs", unit_weight_sum=False)
@_nobody_without_candidates
def _ucs(request: SelectionRequest) -> Selection:
    candidates, importances, rng = request.candidates, request.importances, request.rng
    size = min(request.size, len(candidates))
    if request.ucs_variant == "paper":
        chosen = rng.choice(len(candidates), size=size, replace=False)
        return Selection(candidates[chosen], len(candidates) / size * importances[chosen])
    chosen = rng.choice(len(candidates), size=size, replace=False, p=importances)
    return Selection(candidates[chosen], importances[chosen] / importances[chosen].sum())


@register_selector("cacs", warmup=True)
@_nobody_without_candidates
def _cacs(request: SelectionRequest) -> Selection:
    order = request.order
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    positions = np.argsort(rank[np.asarray(request.candidates)], kind="stable")
    return _counted(request, _draw_columns(acs_columns(request.counts, request.size, positions), request.rng))


def _counted(request: SelectionRequest, draws: np.ndarray) -> Selection:
    first, counted = _first_and_counts(draws)
    return Selection(request.candidates[first], counted / request.size)


def _draw_columns(columns: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator) -> np.ndarray:
    """One independent draw from each column's distribution (acs_columns): the first client, in id
    order, whose cumulative mass exceeds a uniform on the column's total. The same floats as the
    cumulative sum down a column of the whole table, whose zero entries add nothing."""
    cumulative = [np.cumsum(masses) for _, masses in columns]
    uniforms = rng.random(len(columns)) * np.array([column[-1] for column in cumulative])
    return np.array([clients[np.searchsorted(column, uniform, side="right")]
                     for (clients, _), column, uniform in zip(columns, cumulative, uniforms)], dtype=np.int64)


def _first_and_counts(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `draws` in the order first drawn, and how often each was drawn."""
    values, first_positions, counts = np.unique(draws, return_index=True, return_counts=True)
    order = np.argsort(first_positions, kind="stable")
    return values[order], counts[order].astype(np.float64)
