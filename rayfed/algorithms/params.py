"""An algorithm's parameters: the `algorithm:` section of the config, as a pydantic model that each
algorithm extends with its own keys (defaults, ranges, a one-line description each).

The section's common keys are declared here; `algorithm.name` picks the registered algorithm whose
`Params` validates the rest. The same key may mean different things in two algorithms (beta1 is
FedAvgM's server momentum and FedLALR's first-moment decay): each declares and documents its own."""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rayfed.fields import MAX_COEFFICIENT, number, read_float

AGG_WEIGHTINGS = ("uniform", "num_samples")


@dataclass(frozen=True)
class RunFacts:
    """What an algorithm's parameters may be checked against, from the other sections
    (`AlgorithmParams.check`)."""

    num_clients: int
    """N (data.num_clients)."""
    clients_per_round: int
    """S (train.clients_per_round)."""
    everyone_every_round: bool
    """Every client trains in every round: S = N, always online, synchronous rounds."""
    compressor: str
    """compression.name."""
    combined_uploads: str | None = None
    """What hands the server step the round's uploads already combined instead of each client's
    (engine.partial_sums, an aggregation.rule, central privacy), as the config names it; None: nothing."""


class AlgorithmParams(BaseModel):
    """The keys every algorithm takes. Subclass it to declare an algorithm's own, each with
    `Field(default, description=...)`; floats accept ints and YAML's 1e-3, and must be finite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, strict=True, allow_inf_nan=False)
    # Every registered algorithm's own keys, to tell "a key of another algorithm" from a typo.
    known_keys: ClassVar[set[str]] = set()

    name: str = Field("fedavgm", description="the registered algorithm (rayfed algorithms lists them)")
    lr_local: number(gt=0.0, le=MAX_COEFFICIENT) = Field(0.02, description="client learning rate")
    lr_global: number(gt=0.0, le=MAX_COEFFICIENT) = Field(1.0, description="server learning rate")
    agg_weighting: Literal[AGG_WEIGHTINGS] = Field(
        "uniform", description="clients' weights in the average: uniform (1/S) or num_samples (n_i / sum n_j)")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        AlgorithmParams.known_keys.update(name for name in typing.get_type_hints(cls) if not name.startswith("_"))

    @model_validator(mode="before")
    @classmethod
    def _floats_from_text(cls, data: Any) -> Any:
        """Plain `float` fields read like the built-in ones: 1 is 1.0 and '1e-3' is 0.001."""
        if not isinstance(data, dict):
            return data
        floats = {name for name, info in cls.model_fields.items()
                  if info.annotation is float or info.annotation == typing.Optional[float]}
        return {key: read_float(value) if key in floats else value for key, value in data.items()}

    def check(self, run: RunFacts) -> None:
        """Checks against the rest of the run and fills in choices left to it (in place); raises
        ConfigError with one line. The default has nothing to check."""

    def __getattr__(self, name: str) -> Any:
        # A key of another algorithm reads as not set, as in configs written before per-algorithm sections.
        if name in AlgorithmParams.known_keys:
            return None
        return super().__getattr__(name)


def common_keys() -> tuple[str, ...]:
    return tuple(AlgorithmParams.model_fields)
