"""Per-client compute and link speeds, and how long a client's round takes in virtual seconds."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.seeding import Purpose, numpy_rng


@dataclass(frozen=True)
class ClientSpeeds:
    step_time_s: np.ndarray      # seconds per local step, one per client
    upload_bps: np.ndarray       # bytes per second
    download_bps: np.ndarray

    def round_durations(self, clients: np.ndarray, local_steps: int, down_bytes: int, up_bytes: int) -> np.ndarray:
        """Download, then the local steps, then upload: virtual seconds for each of `clients`."""
        return (down_bytes / self.download_bps[clients] + local_steps * self.step_time_s[clients]
                + up_bytes / self.upload_bps[clients])


def make_speeds(num_clients: int, seed: int, *, step_time_s: float, step_time_spread: float,
                upload_bps: float, download_bps: float, bandwidth_spread: float) -> ClientSpeeds:
    """Log-normal speeds with the given medians: value * exp(spread * N(0, 1)), drawn once per client
    (spread 0: identical clients). Device speeds in FL traces are heavy-tailed; a log-normal is the
    usual one-parameter stand-in."""
    rng = numpy_rng(seed, Purpose.CLIENT_SPEEDS)
    normal = rng.standard_normal((3, num_clients))
    return ClientSpeeds(step_time_s=step_time_s * np.exp(step_time_spread * normal[0]),
                        upload_bps=upload_bps * np.exp(bandwidth_spread * normal[1]),
                        download_bps=download_bps * np.exp(bandwidth_spread * normal[2]))
