"""The privacy accountant: the dp-accounting event of one round, derived from the sampler the run
uses, and the epsilon of the rounds so far under RDP or PLD accounting (Google's dp-accounting) or
PRV accounting (Gopi, Lee, Wutschitz, NeurIPS 2021, arXiv:2106.02848: the prv-accountant package).

    selection.selector=poisson   each client independently with q = S / N:
                                 PoissonSampledDpEvent(q, mechanism(z)), add-or-remove-one neighbours,
                                 sensitivity C (one client's clipped upload)
    selection.selector=uniform   S of N without replacement (train.clients_per_round, more under
                                 overcommit): SampledWithoutReplacementDpEvent(N, S, mechanism(z / 2)),
                                 replace-one neighbours (its only accounting in dp-accounting, RDP), whose
                                 sensitivity is 2C: one clipped upload replaced by another
    privacy.scope=local          each client's own report, composed over the rounds so far (a bound for a
                                 client that took part in every one): replace-one neighbours, under which
                                 a report moves by at most 2C, given to the accountants as mechanism(z / 2)
                                 at sensitivity 1 (add-or-remove), which both read alike; dp-accounting's
                                 PLD accountant under replace-one would double the sensitivity again

A round's event is the same in every round, so the epsilon after t rounds is that of t
compositions: under RDP t times one round's RDP at each order (computed once), under PLD the
t-fold self-composition (about a second each, so a run reports it at its evaluated rounds), under
PRV the upper bound of the t-fold composition's epsilon (PRV_EPS_ERROR above the estimate
pfl-research reports; a tenth of a second, also at evaluated rounds)."""
from __future__ import annotations

import contextlib
import functools
import logging
import math
from dataclasses import dataclass

import dp_accounting
import numpy
from dp_accounting import NeighboringRelation
from dp_accounting.mechanism_calibration import LowerEndpointAndGuess, calibrate_dp_mechanism
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant, compute_epsilon

from rayfed.privacy.mechanism import Mechanism

ACCOUNTANTS = ("rdp", "pld", "prv")
# pfl-research's PRVPrivacyAccountant defaults: the largest error allowed in epsilon, and in delta.
PRV_EPS_ERROR = 0.07
PRV_DELTA_ERROR = 1e-10
# Where the search for z starts from below: at z = 0 the sampled Gaussian's RDP is not defined, and below
# about 0.1 dp-accounting's subsampled Laplace overflows.
MIN_NOISE_MULTIPLIER = 0.1


@dataclass(frozen=True)
class RoundEvent:
    """What one round releases, as dp-accounting models it."""

    event: dp_accounting.DpEvent
    neighbours: NeighboringRelation     # the relation the accountants are given
    noise_multiplier: float             # z of the run (0: no noise, no privacy)
    meaning: str = ""                   # what the event stands for, where the relation given does not say it

    def describe(self) -> str:
        return f"{self.event} ({self.meaning or self.neighbours.name.lower() + ' neighbours'})"


def round_event(mechanism: Mechanism, noise_multiplier: float, scope: str, selector: str, num_clients: int,
                sample_size: int) -> RoundEvent:
    """The event of one round: `sample_size` is S, the clients a round samples (more under overcommit)."""
    if scope == "local":
        return RoundEvent(mechanism.event(noise_multiplier / 2), NeighboringRelation.ADD_OR_REMOVE_ONE,
                          noise_multiplier, "replace-one neighbours: a report moves by at most 2C, so z / 2 at "
                                            "sensitivity 1")
    if selector == "poisson":
        return RoundEvent(dp_accounting.PoissonSampledDpEvent(sample_size / num_clients,
                                                              mechanism.event(noise_multiplier)),
                          NeighboringRelation.ADD_OR_REMOVE_ONE, noise_multiplier)
    return RoundEvent(dp_accounting.SampledWithoutReplacementDpEvent(num_clients, sample_size,
                                                                     mechanism.event(noise_multiplier / 2)),
                      NeighboringRelation.REPLACE_ONE, noise_multiplier)


@contextlib.contextmanager
def quiet_absl():
    """dp-accounting warns, through absl, of each fractional RDP order whose series it leaves out (harmless: the
    other orders bound epsilon); a run's output is not the place for them."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def fresh_accountant(kind: str, neighbours: NeighboringRelation):
    return RdpAccountant(neighboring_relation=neighbours) if kind == "rdp" else PLDAccountant(neighbours)


def prv_of(event: dp_accounting.DpEvent):
    """The privacy random variable of one round's event (add-or-remove neighbours, sensitivity 1), or None where
    prv-accountant has none: Poisson-sampled Gaussian, Gaussian, Laplace (its privacy loss bound is 1 / b)."""
    from prv_accountant.privacy_random_variables import (GaussianMechanism, LaplaceMechanism,
                                                         PoissonSubsampledGaussianMechanism)
    sampled = isinstance(event, dp_accounting.PoissonSampledDpEvent)
    if sampled and isinstance(event.event, dp_accounting.GaussianDpEvent):
        return PoissonSubsampledGaussianMechanism(sampling_probability=event.sampling_probability,
                                                  noise_multiplier=event.event.noise_multiplier)
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return GaussianMechanism(noise_multiplier=event.noise_multiplier)
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return LaplaceMechanism(mu=1 / event.noise_multiplier)
    return None


def supported(kind: str, event: RoundEvent) -> bool:
    """Whether the `kind` accountant can account for the event."""
    if kind == "prv":
        return event.neighbours == NeighboringRelation.ADD_OR_REMOVE_ONE and prv_of(event.event) is not None
    return fresh_accountant(kind, event.neighbours).supports(event.event)


class Accountant:
    """Epsilon at `delta` after t rounds of `event`."""

    def __init__(self, kind: str, event: RoundEvent, delta: float):
        self.kind = kind
        self.event = event
        self.delta = delta

    @functools.cached_property
    def _one_round_rdp(self):
        accountant = fresh_accountant("rdp", self.event.neighbours)
        with quiet_absl():
            accountant.compose(self.event.event)
        return accountant.orders, accountant.rdp

    @functools.lru_cache(maxsize=64)
    def epsilon(self, rounds: int) -> float:
        if rounds == 0:
            return 0.0
        if self.event.noise_multiplier == 0:
            return math.inf
        if self.kind == "rdp":
            orders, rdp = self._one_round_rdp
            return float(compute_epsilon(orders, rounds * rdp, self.delta)[0])
        if self.kind == "prv":
            from prv_accountant import PRVAccountant
            # Its Poisson-sampled Gaussian overflows exp() far in the tails, harmlessly (those points are inf).
            with numpy.errstate(over="ignore"):
                accountant = PRVAccountant(prvs=[prv_of(self.event.event)], max_self_compositions=[rounds],
                                           eps_error=PRV_EPS_ERROR, delta_error=PRV_DELTA_ERROR)
                return float(accountant.compute_epsilon(self.delta, [rounds])[2])
        accountant = fresh_accountant("pld", self.event.neighbours)
        accountant.compose(self.event.event, rounds)
        return float(accountant.get_epsilon(self.delta))

    def last_round_within(self, budget: float, rounds: int) -> int:
        """The most rounds, at most `rounds`, whose epsilon is at most `budget` (epsilon grows with the rounds)."""
        if self.epsilon(rounds) <= budget:
            return rounds
        low, high = 0, rounds          # epsilon(low) <= budget < epsilon(high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.epsilon(middle) <= budget else (low, middle)
        return low


def calibrate(kind: str, make_event, target_epsilon: float, delta: float, rounds: int) -> float:
    """The noise multiplier z whose `rounds` rounds of make_event(z) spend `target_epsilon` at `delta`,
    by dp-accounting's search (PRV: by bisection), rounded up to 4 significant digits (so the budget is kept)."""
    neighbours = make_event(1.0).neighbours
    # PRV takes seconds at z this small; RDP's epsilon bounds it from above, which is what the check needs.
    if Accountant("rdp" if kind == "prv" else kind, make_event(MIN_NOISE_MULTIPLIER), delta).epsilon(rounds) <= \
            target_epsilon:
        raise ValueError(f"{rounds} rounds with noise multiplier {MIN_NOISE_MULTIPLIER} already spend at most "
                         f"epsilon {target_epsilon}: set privacy.noise_multiplier instead")
    if kind == "prv":
        return _bisect(lambda value: Accountant(kind, make_event(value), delta).epsilon(rounds) <= target_epsilon,
                       1e-5)
    with quiet_absl():
        z = calibrate_dp_mechanism(lambda: fresh_accountant(kind, neighbours),
                                   lambda value: dp_accounting.SelfComposedDpEvent(make_event(value).event, rounds),
                                   target_epsilon, delta, LowerEndpointAndGuess(MIN_NOISE_MULTIPLIER, 1.0), tol=1e-6)
    return _round_up(z)


def _round_up(z: float) -> float:
    """z rounded up to 4 significant digits."""
    digits = 3 - math.floor(math.log10(z))
    return math.ceil(z * 10 ** digits) / 10 ** digits


def _bisect(keeps, tolerance: float) -> float:
    """The smallest z of 4 significant digits above MIN_NOISE_MULTIPLIER (which does not keep the budget) for which
    `keeps(z)`. The bisection stops once both ends round up to the same such z, which then is that smallest one
    (each PRV evaluation takes about a second); `tolerance` (relative) bounds it where rounding leaves the ends
    one step apart at a boundary."""
    low, high = MIN_NOISE_MULTIPLIER, 1.0
    while not keeps(high):
        low, high = high, high * 2
    while _round_up(low) != _round_up(high) and high - low > tolerance * high:
        middle = (low + high) / 2
        low, high = (low, middle) if keeps(middle) else (middle, high)
    return _round_up(high)
