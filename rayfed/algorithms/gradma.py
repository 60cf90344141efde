"""GradMA-W, GradMA-S and GradMA (Luo et al., CVPR 2023, arXiv:2302.14307, Sec. 4; Alg. 1-4, 7, 8).

GradMA-W corrects every local step: the gradient is projected onto the cone of directions
that do not oppose the gradient at the previous local iterate, the gradient at the received
global model, and the drift x_tau - x_t (Sec. 4.1, Eq. 5). GradMA-S corrects the server momentum
against the memory D of decayed client updates, kept for at most m clients (Sec. 4.2-4.3, Eqs. 6-10, Alg. 3-4).
GradMA does both.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (FLOAT32_BYTES, Algorithm, AlgorithmContext, ClientStates, ClientTask, RoundInfo,
                                    Upload, client_rows, from_keywords, local_sgd, per_client, register_algorithm,
                                    weighted_average)
from rayfed.algorithms.memory import GradientMemory
from rayfed.algorithms.params import AlgorithmParams, RunFacts
from rayfed.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerState
from rayfed.errors import ConfigError
from rayfed.fields import Coefficient, Decay, count
from rayfed.qp import QPInfo, QPStats, cone_project, cone_project_batch, cone_project_blocks


@dataclass
class GradMAServerState:
    params: Tensor                      # x_t
    optimizer: ServerOptimizerState     # mtilde_t, the corrected momentum (model-change orientation, zero at t = 0)
    memory: GradientMemory | None       # D of model changes, counters and buffer of mem_red; None when m = 0


@dataclass
class GradMAClientState:
    last_local: Tensor              # xhat^(i): the final local model of the client's last participation


MAX_MEMORY_SIZE = 10**7
FLOAT64_BYTES = 8
QP_SCOPES = Literal["model", "tensor"]


class LocalCorrection(AlgorithmParams):
    anchor_mode: Literal["last_local", "global"] = Field(
        "last_local", description="x_{t,-1} of the first local step: the client's last local model, or the global one")
    qp_scope: QP_SCOPES = Field("model", description="one QP over the whole model, or one per parameter tensor")
    qp_margin_local: Coefficient = Field(0.0, description="the local QP's margin gamma (<g~, a> >= gamma ||a||)")


class MemoryCorrection(AlgorithmParams):
    beta1: Decay = Field(0.5, description="server momentum of the corrected update")
    beta2: Decay = Field(0.5, description="decay of the updates held in the memory D")
    memory_size: count(ge=0, le=MAX_MEMORY_SIZE) = Field(
        100, description="m: clients whose decayed updates the memory holds (0: no memory)")
    qp_scope: QP_SCOPES = Field("model", description="one QP over the whole model, or one per parameter tensor")
    qp_margin_global: Coefficient = Field(0.0, description="the server QP's margin")

    def check(self, run: RunFacts) -> None:
        if self.memory_size and self.memory_size < run.clients_per_round:
            raise ConfigError(f"algorithm.memory_size={self.memory_size} is below train.clients_per_round="
                              f"{run.clients_per_round}: the memory must hold every sampled client "
                              f"(use at least that, or 0 for no memory)")


class BothCorrections(MemoryCorrection, LocalCorrection):
    pass


@register_algorithm("gradma")
class GradMA(Algorithm):
    """GradMA (Luo et al., CVPR 2023, arXiv:2302.14307, Alg. 1): QP-corrected local steps and a
    memory-corrected server momentum."""

    Params = BothCorrections
    server_lr = True
    weighted = True
    runs_async = True
    vectorizable = True
    state_classes = (GradMAServerState, GradMAClientState, GradientMemory, ServerOptimizerState)
    fixed: ClassVar[dict[str, Any]] = {"correct_locally": True}

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "GradMA":
        return from_keywords(cls, params, param_blocks=list(context.param_blocks), **cls.fixed)

    def memory_bytes(self, num_params: int, num_clients: int, num_blocks: int) -> dict[str, int]:
        parts = {}
        if self.keeps_client_state:
            parts["client states"] = num_clients * num_params * FLOAT32_BYTES      # every client's last local model
        rows = min(self.memory_size, num_clients)
        if rows:
            grams = num_blocks if self.qp_scope == "tensor" else 1
            parts["server memory"] = rows * num_params * FLOAT32_BYTES + grams * rows ** 2 * FLOAT64_BYTES
        return parts

    def __init__(self, lr_local: float, lr_global: float, param_blocks: list[tuple[int, int]], *,
                 correct_locally: bool, memory_size: int = 0, beta1: float = 0.0, beta2: float = 0.0,
                 anchor_mode: str = "last_local", qp_scope: str = "model", qp_margin_local: float = 0.0,
                 qp_margin_global: float = 0.0, agg_weighting: str = "uniform"):
        self.lr_local = lr_local
        self.lr_global = lr_global
        self.param_blocks = param_blocks
        self.correct_locally = correct_locally
        self.memory_size = memory_size
        self.beta1 = beta1
        self.beta2 = beta2
        self.anchor_mode = anchor_mode
        self.qp_scope = qp_scope
        self.qp_margin_local = qp_margin_local
        self.qp_margin_global = qp_margin_global
        self.agg_weighting = agg_weighting
        self.keeps_client_state = correct_locally and anchor_mode == "last_local"
        self.optimizer = ServerOptimizer("momentum", lr_global, beta1=beta1)

    def server_init(self, params: Tensor, num_clients: int) -> GradMAServerState:
        memory = None
        if self.memory_size:
            # More rows than clients could never fill.
            memory = GradientMemory(min(self.memory_size, num_clients), params.numel(), self.beta2,
                                    blocks=self.param_blocks if self.qp_scope == "tensor" else None,
                                    device=params.device, dtype=params.dtype)
        return GradMAServerState(params=params.clone(), optimizer=self.optimizer.init(params), memory=memory)

    def broadcast(self, state: GradMAServerState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: GradMAServerState) -> Tensor:
        return state.params

    def state_bytes(self, state) -> int:
        memory = getattr(state, "memory", None)
        return super().state_bytes(state) + (memory.nbytes if memory is not None else 0)

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: GradMAClientState | None
                     | ClientStates) -> tuple[Upload, GradMAClientState | ClientStates | None]:
        global_params = down["params"]
        if not self.correct_locally:
            local, mean_loss = local_sgd(task, global_params, self.lr_local)
            return Upload({"model_change": local - global_params}, task.num_samples, {"train_loss": mean_loss}), None
        local, mean_loss, qp_metrics = self._worker_update(task, global_params, client_state)
        new_state = (per_client(client_state, GradMAClientState, last_local=local.clone())
                     if self.keeps_client_state else None)
        return (Upload({"model_change": local - global_params}, task.num_samples,
                       {"train_loss": mean_loss, **qp_metrics}), new_state)

    def _worker_update(self, task: ClientTask, global_params: Tensor, client_state: GradMAClientState | None
                       | ClientStates) -> tuple[Tensor, float | Tensor, dict]:
        """Worker_Update (Alg. 2): I steps along the QP-corrected gradient; the three constraint
        gradients are taken on the step's own minibatch. Broadcasting throughout: with a stack of
        clients (a ClientBatchTask and their ClientStates) the iterates are (clients, d) and every
        pass and QP is batched. The QP diagnostics stay tensors until the last step, so a step waits
        for no device."""
        current = task.start_from(global_params)                                       # x_{t,0}
        anchor = global_params.expand_as(current)                                     # x_t, one row per client
        previous = anchor                                                              # x_{t,-1}
        if self.keeps_client_state:
            previous = client_rows(client_state, lambda state: state.last_local, global_params)
        lr = self.lr_local * task.lr_factor
        loss_sum, steps = 0.0, _StepDiagnostics(current)
        for _ in range(task.steps):
            batch = task.next_batch()
            loss, grad = task.loss_and_grad(current, batch)
            gradient = _kept(grad)
            loss_sum = loss_sum + loss.double()
            at_previous = _kept(task.loss_and_grad(previous, batch)[1])               # a1
            at_global = _kept(task.loss_and_grad(anchor, batch)[1])                   # a2
            constraints = [at_previous, at_global, current - anchor]                  # a3 = x_tau - x_t
            corrected, stats = self._project_local(gradient, constraints)
            steps.add(stats)
            previous = current.clone()
            task.decay(current, lr)
            current.sub_(corrected, alpha=lr)
        mean_loss, metrics = loss_sum / task.steps, steps.metrics(task.steps)
        if current.ndim == 1:
            return current, float(mean_loss), {name: value.item() for name, value in metrics.items()}
        return current, mean_loss, metrics

    def _project_local(self, gradient: Tensor, constraints: list[Tensor]) -> tuple[Tensor, QPStats]:
        """QP_l (Eq. 5) of one step: one client's (d,) gradient and its three (d,) constraint rows, or a
        stack's (clients, d) ones."""
        blocks = self.param_blocks if self.qp_scope == "tensor" else None
        if gradient.ndim == 1:
            corrected, stats = cone_project_batch(gradient[None], [row[None] for row in constraints], blocks,
                                                  margin=self.qp_margin_local)
            return corrected[0], stats
        return cone_project_batch(gradient, constraints, blocks, margin=self.qp_margin_local)

    def server_step(self, state: GradMAServerState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[GradMAServerState, dict]:
        change = weighted_average(uploads, "model_change", self.agg_weighting, round_info.weights)   # Delta_{t+1}
        optimizer = self.optimizer.accumulate(change, state.optimizer)        # m_{t+1} = beta1 mtilde_t + Delta_{t+1}
        momentum = optimizer.momentum
        metrics = _combine([upload.metrics for upload in uploads.values()], "qp_local") if self.correct_locally else {}
        if state.memory is not None:
            # mem_red (Alg. 4) only depends on who took part, so it can run after training.
            participants = [client_id for client_id in round_info.sampled if client_id in uploads]
            evicted = state.memory.admit(participants)
            state.memory.update({client_id: uploads[client_id].tensors["model_change"] for client_id in participants})
            momentum, info = self._project(momentum, state.memory.rows, self.qp_margin_global,
                                           gram=state.memory.gram)                # mtilde_{t+1} = QP_g(m_{t+1}, D)
            metrics.update(_qp_row(info, "qp_global"))
            metrics.update(memory_rows=len(state.memory.buffered), memory_evictions=len(evicted))
        # The cone projection is odd (QP(-m, -D) = -QP(m, D)), so model changes and momenta of the
        # opposite sign to the paper's updates give its iterates: x_{t+1} = x_t + eta_g mtilde_{t+1}.
        params = state.params.add(momentum, alpha=self.lr_global)
        return (GradMAServerState(params=params, optimizer=dataclasses.replace(optimizer, momentum=momentum),
                                  memory=state.memory), metrics)

    def _project(self, vector: Tensor, constraints: Tensor, margin: float,
                 gram: Tensor | None = None) -> tuple[Tensor, QPInfo]:
        if self.qp_scope == "model":
            return cone_project(vector, constraints, gram=gram, margin=margin)
        return cone_project_blocks(vector, constraints, self.param_blocks, block_grams=gram, margin=margin)


def _kept(grad: Tensor) -> Tensor:
    """A pass's gradient, safe to keep across the step's next passes: one client's pass returns its
    model's gradient buffer, which the next pass overwrites; a stack's (engine.vectorize) a new tensor."""
    return grad.clone() if grad.ndim == 1 else grad


class _StepDiagnostics:
    """A client's QP_l diagnostics summed over its local steps, as tensors of one entry per client;
    metrics() gives what _combine gives for the steps' QPInfo rows."""

    def __init__(self, params: Tensor):
        clients = 1 if params.ndim == 1 else params.shape[0]
        self.active = torch.zeros(clients, dtype=torch.int64, device=params.device)
        self.change = torch.zeros(clients, dtype=torch.float64, device=params.device)
        self.min_cosine = torch.full((clients,), math.nan, dtype=torch.float64, device=params.device)
        self.failures = torch.zeros(clients, dtype=torch.int64, device=params.device)

    def add(self, stats: QPStats) -> None:
        self.active = self.active + stats.active
        self.change = self.change + stats.relative_change
        self.min_cosine = torch.fmin(self.min_cosine, stats.min_cosine)     # nan only while every step's is nan
        self.failures = self.failures + stats.failed

    def metrics(self, steps: int) -> dict[str, Tensor]:
        """Per client: mean active constraints and relative change, smallest cosine, total failures."""
        return {"qp_local_active": self.active.double() / steps, "qp_local_change": self.change / steps,
                "qp_local_min_cosine": self.min_cosine, "qp_local_failures": self.failures}


def _qp_row(info: QPInfo, prefix: str) -> dict[str, float]:
    return {f"{prefix}_active": info.active, f"{prefix}_change": info.relative_change,
            f"{prefix}_min_cosine": info.min_cosine, f"{prefix}_failures": int(info.failed)}


def _combine(rows: list[dict[str, float]], prefix: str) -> dict[str, float]:
    """QP diagnostics of several calls (a round's clients): mean active constraints and relative
    change, the smallest cosine, the total failures."""
    cosines = [row[f"{prefix}_min_cosine"] for row in rows if not math.isnan(row[f"{prefix}_min_cosine"])]
    return {
        f"{prefix}_active": sum(row[f"{prefix}_active"] for row in rows) / len(rows),
        f"{prefix}_change": sum(row[f"{prefix}_change"] for row in rows) / len(rows),
        f"{prefix}_min_cosine": min(cosines) if cosines else math.nan,
        f"{prefix}_failures": sum(row[f"{prefix}_failures"] for row in rows),
    }


@register_algorithm("gradma_w")
class GradMAW(GradMA):
    """GradMA-W (Luo et al., arXiv:2302.14307, Alg. 2): GradMA's QP-corrected local steps alone."""

    Params = LocalCorrection
    fixed = {"correct_locally": True, "memory_size": 0, "beta1": 0.0}


@register_algorithm("gradma_s")
class GradMAS(GradMA):
    """GradMA-S (Luo et al., arXiv:2302.14307, Alg. 3): GradMA's memory-corrected server momentum alone."""

    Params = MemoryCorrection
    fixed = {"correct_locally": False}
