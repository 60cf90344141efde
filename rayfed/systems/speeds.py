"""Per-client compute and link speeds, and how long a client's round takes in virtual seconds."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.errors import ConfigError
from rayfed.seeding import Purpose, numpy_rng
from rayfed.systems.csv_rows import parse_client_id, parse_number, read_rows

SPEED_TRACE_HEADER = "client_id,step_time_s,upload_bps,download_bps"


@dataclass(frozen=True)
class ClientSpeeds:
    step_time_s: np.ndarray      # seconds per local step, one per client
    upload_bps: np.ndarray       # bytes per second
    download_bps: np.ndarray

    def round_durations(self, clients: np.ndarray, local_steps: np.ndarray, down_bytes: int,
                        up_bytes: int) -> np.ndarray:
        """Download, then the local steps (one count per client), then upload: virtual seconds for each of `clients`."""
        return (down_bytes / self.download_bps[clients] + local_steps * self.step_time_s[clients]
                + up_bytes / self.upload_bps[clients])


def make_speeds(num_clients: int, seed: int, *, step_time_s: float, step_time_spread: float,
                upload_bps: float, download_bps: float, bandwidth_spread: float,
                speed_trace: str | None = None) -> ClientSpeeds:
    """Log-normal speeds with the given medians: value * exp(spread * N(0, 1)), drawn once per client
    (spread 0: identical clients), overridden for the clients a speed trace lists. Device speeds in
    FL traces are heavy-tailed; a log-normal is the usual one-parameter stand-in."""
    rng = numpy_rng(seed, Purpose.CLIENT_SPEEDS)
    normal = rng.standard_normal((3, num_clients))
    speeds = np.stack([step_time_s * np.exp(step_time_spread * normal[0]),
                       upload_bps * np.exp(bandwidth_spread * normal[1]),
                       download_bps * np.exp(bandwidth_spread * normal[2])])
    if speed_trace is not None:
        for client_id, measured in read_speed_trace(speed_trace, num_clients).items():
            speeds[:, client_id] = measured
    return ClientSpeeds(step_time_s=speeds[0], upload_bps=speeds[1], download_bps=speeds[2])


def read_speed_trace(path: str, num_clients: int) -> dict[int, tuple[float, float, float]]:
    """Per-client (step time, upload, download) from a CSV with header SPEED_TRACE_HEADER, in virtual
    seconds and bytes per virtual second, e.g. from FedScale's device-capacity data."""
    measured = {}
    for where, fields in read_rows(path, "systems.speed_trace", SPEED_TRACE_HEADER, "clients"):
        client_id = parse_client_id(fields[0], num_clients, where)
        values = (parse_number(fields[1], "step_time_s", "seconds", where),
                  parse_number(fields[2], "upload_bps", "bytes per second", where),
                  parse_number(fields[3], "download_bps", "bytes per second", where))
        if not all(value > 0 for value in values):
            raise ConfigError(f"{where}: step_time_s, upload_bps and download_bps must all be > 0")
        if client_id in measured:
            raise ConfigError(f"{where}: client_id {client_id} is listed twice")
        measured[client_id] = values
    return measured
