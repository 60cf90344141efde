"""FedGATE and FedCOMGATE (Haddadpour et al., AISTATS 2021, arXiv:2007.01154, Algorithms 2-4): local SGD corrected by a
gradient-tracking vector delta_j that each client keeps, with the upload compressed (compression.*).

Client j in round r: tau steps x <- x - eta (g - delta_j) from w^(r); it uploads
Delta_j = (w^(r) - x) / eta, which the worker compresses to M_j. The server averages the messages,
Delta_bar = (1/K) sum_j M_j, steps w^(r+1) = w^(r) - eta gamma Delta_bar, and replies Delta_bar to
the round's clients, which then track: delta_j <- delta_j + (alpha / tau) (M_j - Delta_bar) (their own
message as sent: the zero-sum invariant sum_j delta_j = 0 holds for any compressor). FedGATE is the
uncompressed case. With `memory` (top-k with error feedback, Sec. B.1, Eqs. 8-9, in the form the authors' code runs) the client
uploads Delta_j + nu_j and, with its uncompressed Delta_j, tracks delta_j += (Delta_j - Delta_bar) / tau
and remembers nu_j += Delta_j - Delta_bar. Clients not sampled keep their state untouched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional

import torch
from pydantic import Field
from torch import Tensor

from rayfed.algorithms.base import (FLOAT32_BYTES, Algorithm, AlgorithmContext, ClientStates, ClientTask, RoundInfo,
                                    Upload, client_rows, from_keywords, local_descent, per_client, register_algorithm,
                                    weighted_average)
from rayfed.algorithms.params import AlgorithmParams, RunFacts
from rayfed.errors import ConfigError
from rayfed.fields import Flag, number

OWN_TERMS = ("compressed", "uncompressed")


class FedGATEParams(AlgorithmParams):
    alpha: number(gt=0.0, le=1.0) = Field(1.0, description="the tracking step: delta_j += (alpha / tau)(M_j - Delta_bar)")
    client_replicas: Optional[Flag] = Field(
        None, description="Option I, clients keep the model and only Delta_bar goes down (default: exactly when "
                          "every client takes part in every round)")

    def check(self, run: RunFacts) -> None:
        """Option I where every client takes part every round, as the paper runs it; Option II otherwise.
        Option I asked for under partial participation is refused."""
        if self.client_replicas is None:
            self.client_replicas = run.everyone_every_round
        elif self.client_replicas and not run.everyone_every_round:
            raise ConfigError("algorithm.client_replicas=true (Option I) needs every client in every round: "
                              "train.clients_per_round = data.num_clients, systems.availability=always and "
                              "train.round_policy=sync; a client that missed a round would hold a stale model")


class FedCOMGATEParams(FedGATEParams):
    own_term: Literal[OWN_TERMS] = Field(
        "compressed", description="a client's own term in its tracking update: its message as sent, or uncompressed")
    memory: Flag = Field(False, description="error feedback nu_j, with compression.name=top_k")

    def check(self, run: RunFacts) -> None:
        if self.memory and run.compressor != "top_k":
            raise ConfigError("algorithm.memory (error feedback) goes with compression.name=top_k")
        super().check(run)


@dataclass
class FedGATEServerState:
    params: Tensor                  # w^(r)
    average: Tensor | None          # Delta_bar of the last round, replied to its clients


@dataclass
class FedGATEClientState:
    tracking: Tensor                # delta_j, zero before the client's first round
    memory: Tensor | None           # nu_j (with memory), in update units
    update: Tensor | None           # this round's uncompressed Delta_j until the reply comes
    steps: int                      # this round's tau


@register_algorithm("fedcomgate")
class FedGATE(Algorithm):
    """FedCOMGATE (Haddadpour et al., AISTATS 2021, arXiv:2007.01154, Alg. 3): gradient tracking with a
    compressed upload."""

    Params = FedCOMGATEParams
    server_lr = True
    takes_compression = True
    state_classes = (FedGATEServerState, FedGATEClientState)
    linear_uploads = True
    weighted = False
    # Its clients track with the average of the round they trained in, which a buffered server never forms.
    runs_async = False
    fixed: ClassVar[dict[str, Any]] = {}
    keeps_client_state = True
    vectorizable = True
    compressed_upload = "accumulated_gradient"
    replies = True
    transient_client_fields = ("update",)

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "FedGATE":
        return from_keywords(cls, params, lr_decay=context.lr_decay, **cls.fixed)

    def memory_bytes(self, num_params: int, num_clients: int, num_blocks: int) -> dict[str, int]:
        # delta_j, with error feedback nu_j too, for every client.
        return {"client states": num_clients * (1 + self.memory) * num_params * FLOAT32_BYTES}

    def __init__(self, lr_local: float, lr_global: float, *, alpha: float = 1.0, own_term: str = "compressed",
                 memory: bool = False, client_replicas: bool = False, lr_decay: float = 1.0):
        self.lr_local = lr_local        # eta
        self.lr_global = lr_global      # gamma
        self.alpha = alpha
        self.own_term = own_term
        self.memory = memory
        # Option I (full participation only): every client applies w <- w - eta gamma Delta_bar to its own
        # replica of the model, so the server sends Delta_bar alone. The models are Option II's; only the
        # downlink a deployment needs differs.
        self.sends_model = not client_replicas
        self.lr_decay = lr_decay

    def server_init(self, params: Tensor, num_clients: int) -> FedGATEServerState:
        return FedGATEServerState(params=params.clone(), average=None)

    def broadcast(self, state: FedGATEServerState) -> dict[str, Tensor]:
        return {"params": state.params}

    def global_params(self, state: FedGATEServerState) -> Tensor:
        return state.params

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: FedGATEClientState | None
                     | ClientStates) -> tuple[Upload, FedGATEClientState | ClientStates]:
        global_params = down["params"]
        tracking = client_rows(client_state, lambda state: state.tracking, torch.zeros_like(global_params))
        memory = None
        if self.memory:
            memory = client_rows(client_state, lambda state: state.memory, torch.zeros_like(global_params))
        lr = self.lr_local * task.lr_factor
        local, mean_loss = local_descent(task, global_params, self.lr_local,
                                         lambda grad, params, step: grad - tracking)
        update = (global_params - local) / lr                              # Delta_j = sum_c (g - delta_j)
        sent = update + memory if self.memory else update

        def trained(tracking: Tensor, update: Tensor, memory: Tensor | None = None) -> FedGATEClientState:
            return FedGATEClientState(tracking=tracking, memory=memory, update=update, steps=task.steps)

        rows = {"tracking": tracking, "update": update, **({"memory": memory} if self.memory else {})}
        return (Upload({"accumulated_gradient": sent}, task.num_samples, {"train_loss": mean_loss}),
                per_client(client_state, trained, **rows))

    def server_step(self, state: FedGATEServerState, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[FedGATEServerState, dict]:
        average = weighted_average(uploads, "accumulated_gradient", "uniform", round_info.weights)      # Delta_bar
        if round_info.downlink is not None:
            # One compressed broadcast: the same decoded value moves the model and every client's tracking.
            average = round_info.downlink(average)
        lr = self.lr_local * self.lr_decay ** round_info.round
        return FedGATEServerState(params=state.params.sub(average, alpha=lr * self.lr_global), average=average), {}

    def server_reply(self, state: FedGATEServerState) -> dict[str, Tensor]:
        return {"average": state.average}

    def client_finish(self, client_state: FedGATEClientState, reply: dict[str, Tensor],
                      sent: Tensor) -> FedGATEClientState:
        """The tracking update once Delta_bar is back; `sent` is the client's upload as the server decoded it."""
        average = reply["average"]
        own = client_state.update if self.memory or self.own_term == "uncompressed" else sent
        tracking = client_state.tracking.add(own - average, alpha=self.alpha / client_state.steps)
        memory = client_state.memory + client_state.update - average if self.memory else None
        return FedGATEClientState(tracking=tracking, memory=memory, update=None, steps=client_state.steps)

    def summarize_client_states(self, client_states: list[FedGATEClientState]) -> dict[str, Tensor | float]:
        tracking = [state.tracking for state in client_states]
        return {"sum": torch.stack(tracking).double().sum(0).cpu() if tracking else None,
                "max_norm": max((float(t.double().norm()) for t in tracking), default=0.0)}

    def combine_state_summaries(self, summaries: list[dict]) -> dict[str, float]:
        """The tracking diagnostics: ||sum_j delta_j|| (0 up to rounding with the paper's rule) and max_j ||delta_j||."""
        sums = [summary["sum"] for summary in summaries if summary["sum"] is not None]
        return {"tracking_sum_norm": float(torch.stack(sums).sum(0).norm()) if sums else 0.0,
                "tracking_max_norm": max(summary["max_norm"] for summary in summaries)}


@register_algorithm("fedgate")
class FedGATEUncompressed(FedGATE):
    """FedGATE (Haddadpour et al., AISTATS 2021, arXiv:2007.01154, Alg. 2): gradient tracking, uncompressed."""

    Params = FedGATEParams
    # It sends its update uncompressed: FedGATE with compression is fedcomgate.
    takes_compression = False
    fixed = {"own_term": "compressed", "memory": False}
