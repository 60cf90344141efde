"""Client-side adaptive optimizers, as `direction`s for base.local_descent: each keeps its
moments over a round's local steps and turns the step's gradient into the direction x moves
against. Written with broadcasting ops only, so a stack of clients (engine.vectorize) trains as one.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


class AMSGradDirection:
    """FedLALR's local step (arXiv:2309.09719, Algorithm 1, Eqs. (2)-(5)), started from the given moments:
        m_k     = beta1 m_{k-1} + (1 - beta1) g_k
        v_k     = beta2 v_{k-1} + (1 - beta2) g_k^2
        v_hat_k = max(v_hat_{k-1}, v_k)
        x_{k+1} = x_k - alpha m_k / sqrt(v_hat_k)
    No bias correction and no additive eps (eps_mode=init: v_hat starts at eps^2 instead); the
    ablations eps_mode=add (denominator sqrt(v_hat) + eps) and bias_correction=True
    (m / (1 - beta1^k), v_hat / (1 - beta2^k), k counted from the round's first step) are options."""

    def __init__(self, m: Tensor, v: Tensor, v_hat: Tensor, beta1: float, beta2: float, eps: float,
                 eps_mode: str = "init", bias_correction: bool = False):
        self.m, self.v, self.v_hat = m, v, v_hat
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.eps_mode = eps_mode
        self.bias_correction = bias_correction

    def __call__(self, grad: Tensor, params: Tensor, step: int) -> Tensor:
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        self.v_hat = torch.maximum(self.v_hat, self.v)
        m, v_hat = self.m, self.v_hat
        if self.bias_correction:
            m = m / (1 - self.beta1 ** step)
            v_hat = v_hat / (1 - self.beta2 ** step)
        if self.eps_mode == "add":
            return m / (v_hat.sqrt() + self.eps)
        return m / v_hat.sqrt()


class AdamDirection:
    """Adam from a fresh state (m = v = 0), bias-corrected, additive eps: torch.optim.Adam's step,
        m_k = beta1 m + (1 - beta1) g,   v_k = beta2 v + (1 - beta2) g^2,
        direction = (m_k / (1 - beta1^k)) / (sqrt(v_k) / sqrt(1 - beta2^k) + eps)."""

    def __init__(self, like: Tensor, beta1: float, beta2: float, eps: float):
        self.m = torch.zeros_like(like)
        self.v = torch.zeros_like(like)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def __call__(self, grad: Tensor, params: Tensor, step: int) -> Tensor:
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        denominator = self.v.sqrt() / math.sqrt(1 - self.beta2 ** step) + self.eps
        return self.m / (1 - self.beta1 ** step) / denominator
