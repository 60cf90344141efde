"""Typed config values: finite numbers and counts within bounds, flags and text, and what a declared
type admits in words. Every section of the config, and every component's parameter model (an
algorithm's, a compressor's), declares its keys with these, so that one key reads and fails alike
wherever it is declared."""
from __future__ import annotations

import math
import typing
from typing import Annotated, Any, Iterable, Literal

import annotated_types
from pydantic import AfterValidator, BeforeValidator, Field

# Bounds far above any real run, so that a typo fails at load time instead of exhausting memory
# or overflowing later: counts of clients, rounds, steps and samples...
MAX_COUNT = 10**7
# ...virtual seconds and bytes per second...
MAX_VIRTUAL = 1e12
# ...and coefficients (learning rates, momenta, penalties): 1e30 would overflow the updates.
MAX_COEFFICIENT = 1e6


def read_float(value: Any) -> Any:
    """Ints are numbers too; YAML 1.1 reads 1e9 (no dot) as a string, and researchers write it so."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def number(*, gt=None, ge=None, lt=None, le: float | None = MAX_VIRTUAL):
    """A finite float in the bounds given; -0.0 is 0.0 (numpy draws with scale -0.0 fail)."""
    return Annotated[float, BeforeValidator(read_float),
                     Field(strict=True, allow_inf_nan=False, gt=gt, ge=ge, lt=lt, le=le),
                     AfterValidator(lambda value: value + 0.0)]


def count(*, gt=None, ge=None, le: int = MAX_COUNT):
    """An int (not a bool, not 2.0) in the bounds given."""
    return Annotated[int, Field(strict=True, gt=gt, ge=ge, le=le)]


Flag = Annotated[bool, Field(strict=True)]
Decay = number(ge=0.0, lt=1.0)
Coefficient = number(ge=0.0, le=MAX_COEFFICIENT)
Positive = number(gt=0.0, le=MAX_COEFFICIENT)


class Names:
    """A key's values are the names in `registry` (the built-ins' and the plugins' loaded so far,
    read when asked) or one of `also`, such as "auto"."""

    def __init__(self, registry: Iterable[str], also: tuple[str, ...]):
        self.registry = registry
        self.also = also

    def choices(self) -> list[str]:
        return [*self.also, *self.registry]


def allowed_values(declared) -> str:
    """What a declared type admits, in words for a message: 'in [0, 1)', '> 0 and at most 1e6',
    'one of: model, tensor'. `declared` is a Literal, or Annotated with constraints (directly, or
    inside pydantic FieldInfo objects), or with Names."""
    if typing.get_origin(declared) is Literal:
        return "one of: " + ", ".join(map(str, typing.get_args(declared)))
    constraints = []
    for info in typing.get_args(declared)[1:]:
        constraints.extend(getattr(info, "metadata", None) or [info])
    names = [constraint for constraint in constraints if isinstance(constraint, Names)]
    if names:
        return "one of: " + ", ".join(names[0].choices())
    bounds = {name: getattr(constraint, name) for constraint in constraints
              for name in ("gt", "ge", "lt", "le") if isinstance(constraint, getattr(annotated_types, name.title()))}
    if "lt" in bounds and ("gt" in bounds or "ge" in bounds):
        opening, lower = ("(", bounds["gt"]) if "gt" in bounds else ("[", bounds["ge"])
        return f"in {opening}{format_number(lower)}, {format_number(bounds['lt'])})"
    words = [f"{symbol} {format_number(bounds[name])}" for name, symbol in (("gt", ">"), ("ge", ">=")) if name in bounds]
    if "le" in bounds:
        words.append(f"at most {format_number(bounds['le'])}")
    return " and ".join(words)


def format_number(value) -> str:
    """1e+06 as 1e6; integers in full, as they would be typed."""
    if isinstance(value, int):
        return str(value)
    mantissa, _, exponent = f"{value:g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa
