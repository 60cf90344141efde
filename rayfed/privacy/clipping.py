"""Clipping a client's upload: all its tensors together (flat) or each parameter tensor's block on
its own (per layer), in the mechanism's norm, to bound what one client adds to the sum."""
from __future__ import annotations

import math

import torch
from torch import Tensor


def pieces(tensors: dict[str, Tensor], blocks: list[tuple[int, int]] | None) -> list[tuple[str, int, int]]:
    """The parts clipped on their own, as (upload name, start, end): each name's model blocks per layer
    (a tensor of another length is one part), or every name whole."""
    parts = []
    for name, tensor in tensors.items():
        size = tensor.numel()
        if blocks and blocks[-1][1] == size:
            parts += [(name, start, end) for start, end in blocks]
        else:
            parts.append((name, 0, size))
    return parts


def clip(tensors: dict[str, Tensor], clip_norm: float, norm: int, per_layer: bool,
         blocks: list[tuple[int, int]] | None) -> tuple[dict[str, Tensor], float]:
    """The upload's tensors (float64) scaled so that their joint `norm`-norm is at most `clip_norm`, or with
    `per_layer` each part's at most clip_norm / sqrt(P) (L2) or clip_norm / P (L1) over its P parts, which
    bounds the joint norm by clip_norm too. Returns them and the upload's norm before clipping (joint)."""
    values = {name: tensor.double() for name, tensor in tensors.items()}
    joint = _norm(torch.cat([value.reshape(-1) for value in values.values()]), norm)
    if not per_layer:
        scale = min(1.0, clip_norm / joint) if joint > 0 else 1.0
        return {name: value * scale for name, value in values.items()}, joint
    parts = pieces(values, blocks)
    bound = clip_norm / (math.sqrt(len(parts)) if norm == 2 else len(parts))
    clipped = {name: value.clone() for name, value in values.items()}
    for name, start, end in parts:
        part = clipped[name][start:end]
        size = _norm(part, norm)
        if size > bound:
            part.mul_(bound / size)
    return clipped, joint


def changes(tensors: dict[str, Tensor], reference: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each upload's change (float64) from the tensor of the same name in `reference`: what is clipped for an
    algorithm whose clients upload models (averages_models), each named as the broadcast tensor it replaces."""
    missing = [name for name in tensors if name not in reference]
    if missing:
        raise KeyError(f"privacy: upload {missing[0]!r} of an algorithm that averages models has no broadcast tensor "
                       f"of that name to take its change from (broadcast: {', '.join(map(repr, reference))})")
    return {name: tensor.double() - reference[name].double().to(tensor.device) for name, tensor in tensors.items()}


def _norm(vector: Tensor, norm: int) -> float:
    return float(torch.linalg.vector_norm(vector, ord=norm))
