"""What a privacy mechanism is: the norm its clipping bounds, the noise it adds, and the
dp-accounting event of one release of a sum whose sensitivity in that norm is 1 (noise scale
divided by sensitivity: the noise multiplier). Mechanisms register like any component
(`register_mechanism`); the accountant composes their events with the sampler's. dp-accounting is
imported only where an event is made: it takes about two seconds, which every Ray actor process
would otherwise pay."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rayfed.errors import ConfigError
from rayfed.registry import PRIVACY_MECHANISMS


class Mechanism:
    norm: int = 2
    """The L-norm that clipping bounds: the norm of the mechanism's sensitivity (2: Gaussian, 1: Laplace)."""

    def noise(self, size: int, scale: float, generator: torch.Generator) -> Tensor:
        """`size` float64 draws of the given scale (the Gaussian's standard deviation, the Laplace's b), on the CPU."""
        raise NotImplementedError

    def event(self, noise_multiplier: float):
        """One release with noise scale / sensitivity = `noise_multiplier`, as dp-accounting models it (a DpEvent)."""
        raise NotImplementedError


def register_mechanism(name: str) -> Callable:
    """Registers a mechanism class or builder `() -> Mechanism` under `name` (rayfed.register_mechanism):
    privacy.mechanism then uses it."""
    def decorate(builder):
        if not callable(builder):
            raise ConfigError(f"register_mechanism({name!r}) takes a Mechanism class or a function () -> Mechanism")
        return PRIVACY_MECHANISMS.register(name)(builder)
    return decorate


def build_mechanism(name: str) -> Mechanism | None:
    """The mechanism privacy.mechanism names; None for `none`."""
    return None if name == "none" else PRIVACY_MECHANISMS.get(name).target()


@register_mechanism("gaussian")
class Gaussian(Mechanism):
    """N(0, (z C)^2) on every coordinate of the sum of uploads clipped to L2 norm C (the Gaussian
    mechanism of DP-FedAvg, McMahan et al., ICLR 2018, arXiv:1710.06963)."""

    norm = 2

    def noise(self, size: int, scale: float, generator: torch.Generator) -> Tensor:
        return torch.randn(size, generator=generator, dtype=torch.float64).mul_(scale)

    def event(self, noise_multiplier: float):
        import dp_accounting
        return dp_accounting.GaussianDpEvent(noise_multiplier)


@register_mechanism("laplace")
class Laplace(Mechanism):
    """Laplace(0, z C) on every coordinate of the sum of uploads clipped to L1 norm C."""

    norm = 1

    def noise(self, size: int, scale: float, generator: torch.Generator) -> Tensor:
        # Inverse CDF of uniforms in (-1/2, 1/2), so that the draws come from the generator given.
        uniforms = torch.rand(size, generator=generator, dtype=torch.float64) - 0.5
        return uniforms.sign().mul_(torch.log1p(-2.0 * uniforms.abs())).mul_(-scale)

    def event(self, noise_multiplier: float):
        import dp_accounting
        return dp_accounting.LaplaceDpEvent(noise_multiplier)
