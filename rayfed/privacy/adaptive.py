"""Adaptive clipping to a quantile (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021,
arXiv:1905.03871, Algorithm 1 with the geometric update): each round the server learns, with
noise, the fraction of the round's clients whose update norm was at most the clip norm C, and
moves C towards the `target_quantile` gamma of the norms:

    b_bar = (sum_i 1[||Delta_i|| <= C] + N(0, sigma_b^2)) / S,     C <- C exp(-eta_C (b_bar - gamma)).

The count is a second release. Noising the clipped sum with multiplier z_Delta and the count with
sigma_b is as private as one Gaussian release of multiplier z (as the paper shows), with

    z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2),

so the run's accountant keeps its event of multiplier z and the update gets z_Delta: the clip's
own privacy cost is paid out of z."""
from __future__ import annotations

import math


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Delta for a total multiplier z; needs z < 2 sigma_b."""
    return (noise_multiplier ** -2 - (2.0 * count_stddev) ** -2) ** -0.5


def next_clip_norm(clip_norm: float, unclipped_fraction: float, target_quantile: float, learning_rate: float) -> float:
    return clip_norm * math.exp(-learning_rate * (unclipped_fraction - target_quantile))
