"""One copy of the training arrays per GPU. Workers that share a GPU (a fractional engine.worker_gpus) would each
move the whole training set there; instead the first worker on each GPU exports its copy's CUDA IPC handles, once
for each other worker (torch counts one receiver per export), and the others map them. A worker that Ray restarts
moves a copy of its own. That a mapping outlives the process that exported it (so a dying worker takes no other
worker's data with it) was measured, not read in CUDA's documentation: experiments/scaling/gpu_checks.py's probe."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor


def gpu_identity(device: torch.device) -> str | None:
    """The GPU this process computes on, by its UUID (the same GPU for every process that maps it, whatever index
    its CUDA_VISIBLE_DEVICES gives it), or None on the CPU."""
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def sharing_groups(identities: list[str | None]) -> list[list[int]]:
    """The workers (by index) that share each GPU, where more than one does: the first of each exports."""
    groups: dict[str, list[int]] = {}
    for index, identity in enumerate(identities):
        if identity is not None:
            groups.setdefault(identity, []).append(index)
    return [members for members in groups.values() if len(members) > 1]


def export_handles(tensors: tuple[Tensor, ...]) -> list[tuple]:
    """What one other process on the same GPU maps as these tensors; the caller keeps them alive."""
    return [reduce_tensor(tensor)[1] for tensor in tensors]


def map_handles(handles: list[tuple]) -> tuple[Tensor, ...]:
    return tuple(rebuild_cuda_tensor(*arguments) for arguments in handles)
