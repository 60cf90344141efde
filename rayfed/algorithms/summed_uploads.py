"""The uploads of a round already combined, which the server step of an algorithm that declares
`linear_uploads` receives in place of the dict of uploads: their exact sums (engine.partial_sums),
or the aggregation rule's outputs (aggregation.rule, rayfed.aggregation). Only `weighted_average`
reads them; any other use is an error that names the declaration."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rayfed.exact_sum import ExactSum


class CombinedUploads:
    """The round's uploads as one vector per upload name; `average` is weighted_average's answer."""

    # What combined them and what the server holds, for messages.
    reason = "engine.partial_sums"
    holds = "the sum of the round's uploads"

    def average(self, name: str, weighting: str, weights: dict[int, float] | None,
                divisor: int | None = None) -> Tensor:
        raise NotImplementedError

    def _refuse(self, *args, **kwargs):
        raise TypeError(f"{self.reason}: the server holds {self.holds}, not each one; an algorithm with "
                        f"linear_uploads = True may read them only through weighted_average")

    __getitem__ = __iter__ = __len__ = __contains__ = keys = values = items = get = _refuse


@dataclass
class SummedUploads(CombinedUploads):
    """sum_i w_i x_i for each upload name over the round's counted clients, exactly (rayfed.exact_sum),
    with w_i = n_i (`weighting` "num_samples") or 1 ("uniform"), and the count it is divided by."""

    sums: dict[str, ExactSum]
    weighting: str
    num_clients: int        # S, the uniform average's divisor
    num_samples: int        # sum_i n_i, the sample-weighted average's divisor

    def average(self, name: str, weighting: str, weights: dict[int, float] | None,
                divisor: int | None = None) -> Tensor:
        """weighted_average of `name`: the exact sum divided by S (or `divisor`) or sum_i n_i, rounded to float32."""
        if weights is not None:
            raise ValueError("engine.partial_sums: the selector's per-client weights cannot apply to summed uploads")
        if weighting != self.weighting:
            raise ValueError(f"engine.partial_sums: the workers summed the uploads with agg_weighting="
                             f"{self.weighting}, but the server step averages them with {weighting}")
        if name not in self.sums:
            raise KeyError(f"engine.partial_sums: no upload named {name!r} (the clients uploaded "
                           f"{', '.join(map(repr, self.sums))})")
        if weighting != "uniform":
            return self.sums[name].mean(self.num_samples)
        return self.sums[name].mean(self.num_clients if divisor is None else divisor)
