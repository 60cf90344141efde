"""Random streams derived from (seed, purpose, round, client_id).

Every random choice in a run draws from a stream named by these four numbers, never
from a shared generator whose position depends on what ran before. That is what makes
a run independent of how clients are spread over workers, and of the order they train in.
"""
from enum import IntEnum

import numpy as np
import torch


class Purpose(IntEnum):
    PARTITION = 1
    MODEL_INIT = 2
    SAMPLE_CLIENTS = 3
    BATCHES = 4
    DROPOUT = 5
    SYNTHETIC_DATA = 6
    CLIENT_SPEEDS = 7
    AVAILABILITY = 8
    AUGMENT = 9
    SHAKESPEARE_CLIENTS = 10
    SELECTION_WARMUP = 11
    COMPRESSION = 12
    GRADIENT_SIMILARITY = 13
    FEMNIST_WRITERS = 14
    COMPRESSION_DOWNLINK = 15
    BUCKETS = 16
    ADVERSARIES = 17
    ATTACK = 18
    PRIVACY_NOISE = 19


def derive_seed(seed: int, purpose: Purpose, round: int = 0, client_id: int = 0) -> int:
    """A 63-bit seed for the stream (seed, purpose, round, client_id)."""
    state = np.random.SeedSequence([seed, int(purpose), round, client_id]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def numpy_rng(seed: int, purpose: Purpose, round: int = 0, client_id: int = 0) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, round, client_id))


def torch_generator(seed: int, purpose: Purpose, round: int = 0, client_id: int = 0,
                    device: str | torch.device = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(seed, purpose, round, client_id))
    return generator


def seed_global_torch(seed: int, device: torch.device) -> None:
    """Seeds the default generators that ops without an explicit generator (dropout) draw from,
    on the CPU and on `device`. Cheaper than torch.manual_seed, which also queues lazy seeding,
    with a captured stack trace, for every accelerator backend that is not initialised."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
