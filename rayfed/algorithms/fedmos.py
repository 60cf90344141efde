"""FedMoS (Wang et al., IEEE INFOCOM 2023, Sec. III-A, Algorithm 1): STORM client momentum with an unscaled proximal pull
toward the round's model, and a heavy-ball server momentum on the aggregated model change.

Client i (Eq. 3): d_0 = the full local gradient at x^t (init_grad=full; or a minibatch's), then I
updates x <- x - eta d - mu (x - x^t), with d corrected between them (storm.storm_descent); it
uploads Delta_i = x_{i,I} - x^t and keeps nothing. Server (Eq. 4):
    u^t = beta u^{t-1} - (1 / (eta_t I)) sum_i w_i Delta_i,    x^{t+1} = x^t - eta_t I u^t,    u^{-1} = 0,
with w the selector's weights (c_i / M under md, acs and cacs). The normalisation eta_t I only
rescales u; I is train.local_steps (train.local_epochs under epochs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, from_keywords,
                                    register_algorithm, weighted_average)
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerState
from rayfed.algorithms.storm import ESTIMATORS, MINIBATCHES, step_batch, storm_descent
from rayfed.fields import Coefficient, Decay, Flag, count, number

INIT_GRADS = ("full", "minibatch")
MAX_INIT_BATCH = 10**7


class FedMoSParams(AlgorithmParams):
    """The values of the FedMoS authors' run.sh (Wang et al., INFOCOM 2023)."""

    a: number(ge=0.0, le=1.0) = Field(0.1, description="STORM's momentum weight: d <- g(x) + (1 - a)(d - g(x_prev))")
    mu: Coefficient = Field(0.001, description="the unscaled proximal pull toward the round's model")
    beta1: Decay = Field(0.8, description="the paper's beta: server heavy-ball momentum on the model changes")
    init_grad: Literal[INIT_GRADS] = Field("full", description="d_0: the full local gradient, or a minibatch's")
    init_batch: Optional[count(ge=1, le=MAX_INIT_BATCH)] = Field(
        None, description="with init_grad=minibatch: B_0 (default the batch size)")
    client_estimator: Literal[ESTIMATORS] = Field(
        "storm_paper", description="Eq. 3 as the paper writes it, or as the reference code computes it")
    minibatches: Literal[MINIBATCHES] = Field(
        "independent", description="fresh draws without replacement each step (unbiased), or shuffled epochs")
    server_momentum_skip_round0: Flag = Field(False, description="no momentum step in the first round (the code's)")


@dataclass
class FedMoSState:
    params: Tensor                      # x^t
    optimizer: ServerOptimizerState     # -u^{t-1} (model-change orientation), zero before round 0


@register_algorithm("fedmos")
class FedMoS(Algorithm):
    """FedMoS (Wang et al., INFOCOM 2023): STORM client momentum, a proximal pull, server heavy ball."""

    Params = FedMoSParams
    weighted = True
    runs_async = True
    takes_compression = True
    state_classes = (FedMoSState, ServerOptimizerState)
    linear_uploads = True
    server_lr = False
    keeps_client_state = False
    vectorizable = True
    compressed_upload = "model_change"

    def __init__(self, lr_local: float, lr_global: float, *, a: float, mu: float, beta1: float,
                 init_grad: str = "full", init_batch: int | None = None, client_estimator: str = "storm_paper",
                 minibatches: str = "independent", server_momentum_skip_round0: bool = False,
                 local_steps: int = 1, lr_decay: float = 1.0, agg_weighting: str = "uniform"):
        self.lr_local = lr_local            # eta; FedMoS has no server learning rate
        self.a = a
        self.mu = mu
        self.beta1 = beta1                  # the paper's beta
        self.init_grad = init_grad
        self.init_batch = init_batch
        self.client_estimator = client_estimator
        self.minibatches = minibatches
        self.skip_round0 = server_momentum_skip_round0
        self.local_steps = local_steps
        self.lr_decay = lr_decay
        self.agg_weighting = agg_weighting
        self.optimizer = ServerOptimizer("momentum", 1.0, beta1=beta1)

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "FedMoS":
        return from_keywords(cls, params, local_steps=context.local_steps, lr_decay=context.lr_decay)

    def server_init(self, params: Tensor, num_clients: int) -> FedMoSState:
        return FedMoSState(params=params.clone(), optimizer=self.optimizer.init(params))

    def broadcast(self, state: FedMoSState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedMoSState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: None) -> tuple[Upload, None]:
        global_params = down["params"]
        params = task.start_from(global_params)
        loss, direction = initial_direction(task, params, self.init_grad, self.minibatches, self.init_batch)
        direction = direction.clone()
        params, _, loss_sum = storm_descent(task, params, direction, self.lr_local, self.a, mu=self.mu,
                                            anchor=global_params, minibatches=self.minibatches,
                                            estimator=self.client_estimator)
        mean_loss = (loss.double() + loss_sum) / task.steps
        return Upload({"model_change": params - global_params}, task.num_samples,     # Delta_i = x_{i,I} - x^t
                      {"train_loss": float(mean_loss) if mean_loss.ndim == 0 else mean_loss}), None

    def server_step(self, state: FedMoSState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedMoSState, dict]:
        aggregate = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)  # sum w_i Delta_i
        if self.skip_round0 and round_info.round == 0:
            # The authors' code: the first aggregate moves x but never enters u.
            return FedMoSState(params=state.params.add(aggregate), optimizer=state.optimizer), {}
        scale = self.lr_local * self.lr_decay ** round_info.round * self.local_steps      # eta_t I
        # Eq. 4 with -u as the heavy ball's m: m <- beta m + Delta / (eta_t I), x <- x + eta_t I m.
        params, optimizer = self.optimizer.step(state.params, aggregate, state.optimizer, lr=scale,
                                                scale=1.0 / scale)
        return FedMoSState(params=params, optimizer=optimizer), {}


def initial_direction(task: ClientTask, params: Tensor, init_grad: str, minibatches: str,
                      init_batch: int | None = None) -> tuple[Tensor, Tensor]:
    """(loss, d_0): the full local gradient at `params` (init_grad=full), or a minibatch's. The
    step-0 batch is taken from the stream either way, so every later step sees the same batch
    whichever the mode (step tau uses batch tau)."""
    batch = step_batch(task, minibatches, init_batch)
    if init_grad == "full":
        return task.full_loss_and_grad(params)
    return task.loss_and_grad(params, batch)

