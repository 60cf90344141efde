"""Server optimizers: x_{t+1} from x_t and the round's model change Delta_t = sum_i w_i (y_i - x_t),
the clients' aggregated move (an ascent direction for the model). An algorithm's server step is
"aggregate the clients' model changes, then one of these" (FedJAX's shape), written once here:

    sgd:       x += eta Delta_t                                           (FedAvg, FedProx, FedCOM, LaFedOPT)
    momentum:  m_t = beta1 m_{t-1} + s Delta_t;  x += eta m_t              (heavy ball: FedAvgM, MIFAM, GradMA, FedMoS)

where s scales the direction (1; FedMoS's 1 / (eta_t I)). The adaptive ones (Reddi et al., ICLR
2021; FedAMS, Wang, Lin and Chen, ICML 2022) differ only in the second moment and the denominator:

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    adam:     v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                      x += eta m_t / (sqrt(v_t) + tau)
    yogi:     v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   x += eta m_t / (sqrt(v_t) + tau)
    adagrad:  v_t = v_{t-1} + Delta_t^2                                        x += eta m_t / (sqrt(v_t) + tau)
    ams_v1:   v_t as adam, v_hat_t = max(v_hat_{t-1}, v_t, eps)                 x += eta m_t / sqrt(v_hat_t)
    ams_v2:   v_t as adam, v_hat_t = max(v_hat_{t-1}, v_t)                      x += eta m_t / (sqrt(v_hat_t) + eps)
    sgd:      x += eta Delta_t

FedAdam/Yogi/Adagrad start from m = 0, v = tau^2 (Reddi et al. require v_{-1} >= tau^2); FedAMS from
m = v = v_hat = 0. No bias correction unless asked (m / (1 - beta1^t), v / (1 - beta2^t), t counted
from 1 at the first step; for ams_* it corrects v_hat, as FedCAMS's code and torch's AMSGrad do).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

RULES = ("adam", "yogi", "adagrad", "ams_v1", "ams_v2", "sgd", "momentum")


@dataclass
class ServerOptimizerState:
    momentum: Tensor            # m_{t-1}
    v: Tensor                   # v_{t-1}
    v_hat: Tensor | None        # v_hat_{t-1} of the ams rules; None otherwise
    steps: int = 0              # steps taken: the bias correction's t


class ServerOptimizer:
    def __init__(self, rule: str, lr: float, beta1: float = 0.0, beta2: float = 0.0, eps: float = 0.0,
                 bias_correction: bool = False):
        self.rule = rule
        self.lr = lr                # eta, the server learning rate
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps              # tau for adam, yogi and adagrad; FedAMS's eps for the ams rules
        self.bias_correction = bias_correction

    def init(self, params: Tensor) -> ServerOptimizerState | None:
        if self.rule == "sgd":
            return None
        if self.rule == "momentum":
            return ServerOptimizerState(params.new_zeros(params.shape), None, None)
        if self.rule.startswith("ams"):
            return ServerOptimizerState(params.new_zeros(params.shape), params.new_zeros(params.shape),
                                        params.new_zeros(params.shape))
        return ServerOptimizerState(params.new_zeros(params.shape), torch.full_like(params, self.eps ** 2), None)

    def step(self, params: Tensor, pseudo_gradient: Tensor, state: ServerOptimizerState | None,
             lr: float | None = None, scale: float = 1.0) -> tuple[Tensor, ServerOptimizerState | None]:
        """(x_{t+1}, the next state) from x_t, Delta_t and the state before the step (sgd keeps none);
        `lr` replaces eta for this step, `scale` is the momentum rule's s."""
        lr = self.lr if lr is None else lr
        if self.rule == "sgd":
            return params.add(pseudo_gradient, alpha=lr), state
        if self.rule == "momentum":
            state = self.accumulate(pseudo_gradient, state, scale)
            return params.add(state.momentum, alpha=lr), state
        steps = state.steps + 1
        delta, squared = pseudo_gradient, pseudo_gradient * pseudo_gradient
        momentum = self.beta1 * state.momentum + (1 - self.beta1) * delta
        if self.rule == "yogi":
            v = state.v - (1 - self.beta2) * squared * torch.sign(state.v - squared)
        elif self.rule == "adagrad":
            v = state.v + squared
        else:
            v = self.beta2 * state.v + (1 - self.beta2) * squared
        v_hat = None
        if self.rule == "ams_v1":
            v_hat = torch.maximum(torch.maximum(state.v_hat, v), torch.full_like(v, self.eps))
        elif self.rule == "ams_v2":
            v_hat = torch.maximum(state.v_hat, v)
        first, second = momentum, v if v_hat is None else v_hat
        if self.bias_correction:
            first, second = first / (1 - self.beta1 ** steps), second / (1 - self.beta2 ** steps)
        if self.rule == "ams_v1":
            denominator = second.sqrt()
        else:
            denominator = second.sqrt() + self.eps
        return params + lr * first / denominator, ServerOptimizerState(momentum, v, v_hat, steps)

    def accumulate(self, pseudo_gradient: Tensor, state: ServerOptimizerState, scale: float = 1.0) -> ServerOptimizerState:
        """The momentum rule's m_t = beta1 m_{t-1} + s Delta_t alone: for a step that corrects m_t before
        taking it (GradMA's memory QP)."""
        return ServerOptimizerState(state.momentum.mul(self.beta1).add_(pseudo_gradient, alpha=scale), None, None,
                                    state.steps + 1)
