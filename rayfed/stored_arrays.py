"""Tensors from numpy arrays that may have been read from Ray's object store.

Such an array is a read-only view of shared memory: one copy on a node however many processes read it. A tensor
that is only read may share it; one that is handed on as the receiver's own must be a copy, or torch would write
into (or be told it owns) memory it does not.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import Tensor


def owned_tensor(array: np.ndarray) -> Tensor:
    """A tensor the caller owns: the array itself when it is writable, else a copy."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def shared_tensor(array: np.ndarray, device: torch.device) -> Tensor:
    """The array on `device`, sharing its memory when that is the CPU; the caller only reads it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array).to(device)
