"""CIFAR-style augmentation (FedLALR, arXiv:2309.09719, Sec. V-A, as in FedDyn's CIFAR loader): a random crop of
the image zero-padded by 4 pixels, then a random horizontal flip, for a whole minibatch at once on
the device it lives on."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CROP_PADDING = 4


def random_crop_flip(images: Tensor, generator: torch.Generator, padding: int = CROP_PADDING) -> Tensor:
    """`images` (N, C, H, W), each cropped back to H x W from its zero-padded self at an offset drawn
    from [0, 2 * padding] in each direction, and mirrored left-right with probability 1/2.
    The draws come from the CPU `generator`, offsets then flips, so that the same stream gives the
    same crops on any device (CUDA generators produce other numbers from the same seed)."""
    count, channels, height, width = images.shape
    offsets = torch.randint(0, 2 * padding + 1, (count, 2), generator=generator).to(images.device)
    flips = torch.randint(0, 2, (count,), generator=generator).to(images.device, torch.bool)
    padded = F.pad(images, (padding, padding, padding, padding))
    rows = offsets[:, 0, None] + torch.arange(height, device=images.device)
    columns = offsets[:, 1, None] + torch.arange(width, device=images.device)
    # Mirroring a crop is reading its columns right to left.
    columns = torch.where(flips[:, None], columns.flip(1), columns)
    samples = torch.arange(count, device=images.device)[:, None, None, None]
    planes = torch.arange(channels, device=images.device)[None, :, None, None]
    return padded[samples, planes, rows[:, None, :, None], columns[:, None, None, :]]
