"""What an aggregation rule is: the round's uploads of one name, stacked as rows in client-id order,
in; one vector out, which the algorithm's server step reads in place of their weighted average.

A rule is pure torch. It is built from the `aggregation:` section by the builder registered under
its name (`register_rule`), which declares the section's keys it takes; a stateful rule (centered
clipping) also gets its own output of the round before."""
from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from rayfed.registry import AGGREGATION_RULES, keyed_builder

# The `aggregation:` keys a rule may take, besides `rule` and `bucket_size` (which apply to every rule).
RULE_KEYS = ("num_byzantine", "multi_krum_m", "iterations", "tolerance", "smoothing", "clip_radius")
# A key's declared default when the user must set it.
REQUIRED = "required"


class Rule(Protocol):
    stateful: bool
    """It reads its own output of the previous round (`previous`; None in the first round)."""

    def __call__(self, rows: Tensor, previous: Tensor | None) -> Tensor:
        """The aggregate of `rows` (n, d): a (d,) vector."""


def register_rule(name: str, *, keys: dict[str, Any] | None = None):
    """Registers an aggregation-rule builder `(aggregation section) -> Rule` under `name`
    (rayfed.register_rule): aggregation.rule then uses it. `keys`: the aggregation.* keys it takes
    (of num_byzantine, multi_krum_m, iterations, tolerance, smoothing, clip_radius) and their
    defaults: REQUIRED where the user must set one, None where the rule decides when it runs; the
    others must stay unset."""
    return keyed_builder(AGGREGATION_RULES, name, keys, "aggregation", RULE_KEYS, "rule")


def build_rule(aggregation) -> Rule | None:
    """The rule the section names; None for `mean`, which leaves the algorithm's own weighted average."""
    return AGGREGATION_RULES.get(aggregation.rule).target(aggregation)


class TooFewInputs(ValueError):
    """A round gave the rule fewer inputs than it is defined for."""

    def __init__(self, rule: str, inputs: int, needed: int, why: str):
        super().__init__(f"aggregation.rule={rule} got {inputs} input(s) this round; it needs at least {needed} ({why})")
        self.rule, self.needed, self.why = rule, needed, why


def too_few(rule: str, inputs: int, needed: int, why: str) -> TooFewInputs:
    return TooFewInputs(rule, inputs, needed, why)
