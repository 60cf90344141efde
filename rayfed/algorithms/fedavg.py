"""FedAvg, FedAvgM, FedProx, FedProxM, and FedCOM/FedPAQ's uncompressed server rule.

One class covers them all: FedAvgM with server momentum beta1 and the FedProx proximal term mu.
FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629) is beta1 = 0, mu = 0; FedProx (Li et al.,
MLSys 2020, arXiv:1812.06127) is beta1 = 0; FedAvgM (Hsu et al., 2019, arXiv:1909.06335) is mu = 0.
FedCOM (Haddadpour et al., AISTATS 2021, arXiv:2007.01154, Algorithm 1) is FedAvg with a server step
gamma (lr_global) and a compressed upload; FedPAQ (Reisizadeh et al., AISTATS 2020,
arXiv:1909.13014) is FedCOM with gamma = 1, as the FedPAQ paper runs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, from_keywords,
                                    local_sgd, register_algorithm, weighted_average)
from rayfed.algorithms.objective import LocalObjective, Proximal
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerState
from rayfed.fields import Coefficient, Decay


class ServerMomentum(AlgorithmParams):
    beta1: Decay = Field(0.9, description="server heavy-ball momentum: m <- beta1 m + d, x <- x - lr_global m")


class ProximalParams(AlgorithmParams):
    mu: Coefficient = Field(0.01, description="FedProx's proximal coefficient: clients minimise "
                                              "F_i(w) + mu/2 ||w - x_t||^2")


class ProximalMomentum(ServerMomentum, ProximalParams):
    pass


@dataclass
class FedAvgMState:
    params: Tensor                      # x_t
    optimizer: ServerOptimizerState     # the heavy ball's m_t (model-change orientation), zero at t = 0


class FedAvgM(Algorithm):
    """FedAvgM (Hsu et al., 2019, arXiv:1909.06335): FedAvg with server heavy-ball momentum."""

    Params = ServerMomentum
    server_lr = True
    weighted = True
    runs_async = True
    takes_compression = True
    state_classes = (FedAvgMState, ServerOptimizerState)
    linear_uploads = True
    staleness_weighted = True
    fixed: ClassVar[dict[str, Any]] = {"mu": 0.0}
    keeps_client_state = False
    vectorizable = True
    compressed_upload = "model_change"

    def __init__(self, lr_local: float, lr_global: float,
                 beta1: float = 0.0, mu: float = 0.0, agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        self.lr_global = lr_global
        self.beta1 = beta1
        self.mu = mu
        self.agg_weighting = agg_weighting
        # With beta1 = 0 the heavy ball is plain averaging: m = Delta, x <- x + lr_global Delta.
        self.optimizer = ServerOptimizer("momentum", lr_global, beta1=beta1)

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "FedAvgM":
        return from_keywords(cls, params, **cls.fixed)

    def server_init(self, params: Tensor, num_clients: int) -> FedAvgMState:
        return FedAvgMState(params=params.clone(), optimizer=self.optimizer.init(params))

    def broadcast(self, state: FedAvgMState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedAvgMState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        global_params = down["params"]
        objective = LocalObjective(terms=(Proximal(self.mu, global_params),))      # F_i(w) + mu/2 ||w - x||^2
        local, mean_loss = local_sgd(task, global_params, self.lr_local, objective)
        return Upload({"model_change": local - global_params}, task.num_samples, {"train_loss": mean_loss}), None

    def server_step(self, state: FedAvgMState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedAvgMState, dict]:
        change = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)   # Delta_{t+1}
        params, optimizer = self.optimizer.step(state.params, change, state.optimizer)   # m += ..., x + eta_g m
        return FedAvgMState(params=params, optimizer=optimizer), {}


register_algorithm("fedavgm")(FedAvgM)


class FedAvgMServer(FedAvgM):
    """FedAvgM's server under a client that minimises its own local objective (MOON, FedMLB and
    their M variants), built from its `algorithm:` section. A section without beta1 (it reads as
    unset) gets FedAvg's server: the heavy ball with beta1 = 0."""

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "FedAvgMServer":
        return cls(params, context)

    def __init__(self, params: AlgorithmParams, context: AlgorithmContext):
        self.lr_local = params.lr_local
        self.lr_global = params.lr_global
        self.agg_weighting = params.agg_weighting
        self.optimizer = ServerOptimizer("momentum", params.lr_global, beta1=params.beta1 or 0.0)


@register_algorithm("fedavg")
class FedAvg(FedAvgM):
    """FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629): the average of the clients' local SGD."""

    Params = AlgorithmParams
    fixed = {"beta1": 0.0, "mu": 0.0}


@register_algorithm("fedprox")
class FedProx(FedAvgM):
    """FedProx (Li et al., MLSys 2020, arXiv:1812.06127): local SGD on the proximal objective."""

    Params = ProximalParams
    fixed = {"beta1": 0.0}


@register_algorithm("fedproxm")
class FedProxM(FedAvgM):
    """FedProxM: FedProx with FedAvgM's server momentum (GradMA's baseline, arXiv:2302.14307)."""

    Params = ProximalMomentum
    fixed = {}


@register_algorithm("fedcom")
class FedCOM(FedAvg):
    """FedCOM (Haddadpour et al., AISTATS 2021, arXiv:2007.01154, Alg. 1): FedAvg with a compressed upload."""

    staleness_weighted = False


@register_algorithm("fedpaq")
class FedPAQ(FedCOM):
    """FedPAQ (Reisizadeh et al., AISTATS 2020, arXiv:1909.13014): FedCOM as its paper runs it (lr_global = 1)."""
