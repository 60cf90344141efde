"""FedLALR (Sun et al., arXiv:2309.09719, Sec. III-B, Algorithm 1), its variants restart momentum (Corollary 2,
Algorithm 2) and max aggregation of v_hat (Corollary 3, Algorithm 3), and naive local AMSGrad.

Every sampled client starts from the server's (x, m, v_hat), with its plain EMA v also set to
v_hat (Alg. 1 line 3), runs the round's local AMSGrad steps (local_adaptive.AMSGradDirection) and
sends (x, m, v_hat) back; the server averages all three. Clients keep nothing between rounds.
Restart momentum neither sends nor keeps m: clients restart it at 0. Naive local AMSGrad
synchronises only x: clients restart m at 0 and v, v_hat at eps^2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, from_keywords,
                                    local_descent, register_algorithm, weighted_average)
from rayfed.algorithms.local_adaptive import AMSGradDirection
from rayfed.algorithms.params import AlgorithmParams, RunFacts
from rayfed.errors import ConfigError
from rayfed.fields import Decay, Flag, Positive

# The smallest normal float32: v_hat starts at eps^2 and must stay a normal number.
MIN_NORMAL_FLOAT32 = 1.1754943508222875e-38


class LocalAMSGradParams(AlgorithmParams):
    """The CIFAR-10 values of FedLALR's paper (Sun et al., "FedLALR: Client-Specific Adaptive Learning
    Rates Achieve Linear Speedup for Non-IID Data", 2023)."""

    beta1: Decay = Field(0.9, description="local AMSGrad's first-moment decay")
    beta2: Decay = Field(0.995, description="local AMSGrad's second-moment decay")
    eps: Positive = Field(1e-8, description="v_hat starts at eps^2 (eps_mode=init), or eps joins the denominator (add)")
    eps_mode: Literal["init", "add"] = Field("init", description="where eps enters: v_hat's start, or the denominator")
    bias_correction: Flag = Field(False, description="Adam's bias correction of m and v_hat")

    def check(self, run: RunFacts) -> None:
        if self.eps_mode == "init" and self.eps ** 2 < MIN_NORMAL_FLOAT32:
            raise ConfigError(f"algorithm.eps={self.eps:g} is too small for eps_mode=init: v_hat starts at "
                              f"eps^2, which float32 cannot hold below {MIN_NORMAL_FLOAT32:.3g} (use eps >= 1.1e-19)")


class FedLALRParams(LocalAMSGradParams):
    restart_momentum: Flag = Field(False, description="clients restart m at 0 and only x, v_hat are synchronised "
                                                      "(Algorithm 2)")
    vhat_agg: Literal["mean", "max"] = Field("mean", description="how the server combines the clients' v_hat "
                                                                 "(max: Algorithm 3)")
    trace_v_hat: Flag = Field(False, description="log each participant's ||v_hat||^2 after every local step")

    def check(self, run: RunFacts) -> None:
        super().check(run)
        if run.combined_uploads is None:
            return
        if self.vhat_agg == "max":
            raise ConfigError(f"algorithm.vhat_agg=max (Algorithm 3) takes the largest of each client's v_hat, "
                              f"which {run.combined_uploads} does not hand the server: use vhat_agg=mean")
        if self.trace_v_hat:
            raise ConfigError(f"algorithm.trace_v_hat logs each client's trace, which {run.combined_uploads} does "
                              f"not hand the server")


@dataclass
class FedLALRState:
    params: Tensor              # x_t
    momentum: Tensor | None     # m_{t-1}, zero before round 0; None when it is not synchronised
    v_hat: Tensor | None        # v_hat_{t-1}, eps^2 before round 0 (C1); None for naive local AMSGrad


@register_algorithm("fedlalr")
class FedLALR(Algorithm):
    """FedLALR (Sun et al., 2023, arXiv:2309.09719, Algorithm 1): local AMSGrad whose x, m and v_hat the server averages."""

    Params = FedLALRParams
    weighted = True
    state_classes = (FedLALRState,)
    server_lr = False
    # Clients upload models and moments, not changes: averaging those of clients that started from
    # older server versions would pull the model back and let v_hat fall.
    averages_models = True
    # With vhat_agg=mean (and no trace) its step reads the uploads only through weighted_average;
    # FedLALRParams.check refuses the other settings where uploads come combined.
    linear_uploads = True
    runs_async = False
    fixed: ClassVar[dict[str, Any]] = {}
    keeps_client_state = False
    vectorizable = True

    def __init__(self, lr_local: float, lr_global: float, *, beta1: float, beta2: float, eps: float,
                 eps_mode: str = "init", bias_correction: bool = False, restart_momentum: bool = False,
                 vhat_agg: str = "mean", synchronize_moments: bool = True, trace_v_hat: bool = False,
                 agg_weighting: str = "uniform"):
        self.lr_local = lr_local            # alpha; FedLALR has no server learning rate
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.eps_mode = eps_mode
        self.bias_correction = bias_correction
        self.restart_momentum = restart_momentum or not synchronize_moments
        self.vhat_agg = vhat_agg
        self.synchronize_moments = synchronize_moments
        self.trace_v_hat = trace_v_hat
        self.agg_weighting = agg_weighting

    def _initial_v_hat(self, like: Tensor) -> Tensor:
        """eps^2 (the paper), or 0 where eps is added to the denominator instead (eps_mode=add)."""
        return torch.full_like(like, self.eps ** 2 if self.eps_mode == "init" else 0.0)

    def server_init(self, params: Tensor, num_clients: int) -> FedLALRState:
        momentum = None if self.restart_momentum else params.new_zeros(params.shape)      # m_{-1} = 0
        v_hat = self._initial_v_hat(params) if self.synchronize_moments else None         # v_hat_{-1} = eps^2
        return FedLALRState(params=params.clone(), momentum=momentum, v_hat=v_hat)

    def broadcast(self, state: FedLALRState) -> dict[str, Tensor]:
        """x_t, m_{t-1}, v_hat_{t-1} (Alg. 1: 3d); no m with restart momentum (Alg. 2: 2d); x only
        for naive local AMSGrad (d). What is sent is what the traffic figures count."""
        down = {"params": state.params}
        if state.momentum is not None:
            down["momentum"] = state.momentum
        if state.v_hat is not None:
            down["v_hat"] = state.v_hat
        return down

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "FedLALR":
        return from_keywords(cls, params, **cls.fixed)

    def upload_size(self, num_params: int) -> int:
        return num_params * (3 if not self.restart_momentum else 2 if self.synchronize_moments else 1)

    def download_size(self, num_params: int) -> int:
        return self.upload_size(num_params)

    def global_params(self, state: FedLALRState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        params = down["params"]
        momentum = down.get("momentum", torch.zeros_like(params))            # m_{t,0,i} = m_{t-1}, or 0
        v_hat = down["v_hat"] if "v_hat" in down else self._initial_v_hat(params)
        # v_{t,0,i} = v_hat_{t,0,i} = v_hat_{t-1}: the EMA v restarts from the synchronised v_hat (C7).
        direction = AMSGradDirection(momentum, v_hat, v_hat, self.beta1, self.beta2, self.eps,
                                     self.eps_mode, self.bias_correction)
        traced = _VHatTrace(direction) if self.trace_v_hat else direction
        local, mean_loss = local_descent(task, params, self.lr_local, traced)
        metrics = {"train_loss": mean_loss}
        if self.trace_v_hat:
            metrics["v_hat_sq_norms"] = traced.norms()
        sent = {"params": local.clone()}     # `local` is the resident model, which the next client overwrites
        if "momentum" in down:
            sent["momentum"] = direction.m
        if "v_hat" in down:
            sent["v_hat"] = direction.v_hat
        return Upload(sent, task.num_samples, metrics), None

    def server_step(self, state: FedLALRState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedLALRState, dict]:
        weights = round_info.weights
        params = weighted_average(uploads, "params", self.agg_weighting, weights)                      # eq. (6)
        momentum = None
        if state.momentum is not None:
            momentum = weighted_average(uploads, "momentum", self.agg_weighting, weights)
        v_hat = None
        if state.v_hat is not None:
            if self.vhat_agg == "max":                                                   # Alg. 3
                v_hat = torch.stack([upload.tensors["v_hat"] for upload in uploads.values()]).amax(dim=0)
            else:
                # Every client's v_hat is >= v_hat_{t-1}, so their mean is too (C4); a rounded float
                # mean of equal values can fall an ulp short of it.
                v_hat = torch.maximum(weighted_average(uploads, "v_hat", self.agg_weighting, weights), state.v_hat)
        metrics = {}
        if v_hat is not None:
            # The range of the per-coordinate learning-rate multiplier 1/sqrt(v_hat) (Lemma 5).
            metrics = {"v_hat_min": float(v_hat.min()), "v_hat_max": float(v_hat.max())}
        if self.trace_v_hat:
            metrics["v_hat_sq_norms"] = {str(client): upload.metrics["v_hat_sq_norms"]
                                         for client, upload in uploads.items()}
        return FedLALRState(params=params, momentum=momentum, v_hat=v_hat), metrics


class _VHatTrace:
    """The experiment of the paper's Fig. 7: ||v_hat||^2 after every local step of a client,
    whose growth is the decay of its effective learning rate."""

    def __init__(self, direction: AMSGradDirection):
        self.direction = direction
        self.trace: list[Tensor] = []

    def __call__(self, grad: Tensor, params: Tensor, step: int) -> Tensor:
        result = self.direction(grad, params, step)
        self.trace.append(self.direction.v_hat.square().sum(dim=-1))
        return result

    def norms(self) -> list[float] | Tensor:
        """A list of floats; with a stack of clients (engine.vectorize), a (clients, steps) tensor."""
        norms = torch.stack(self.trace, dim=-1).double()
        return norms.tolist() if norms.ndim == 1 else norms


@register_algorithm("local_amsgrad")
class LocalAMSGrad(FedLALR):
    """Naive local AMSGrad (FedLALR's baseline, Sun et al., 2023, arXiv:2309.09719): only x is synchronised."""

    Params = LocalAMSGradParams
    fixed = {"synchronize_moments": False}
