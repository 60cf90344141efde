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
    """One value per client, or one number for all when a quantity has no spread: at N = 10^7 the
    three arrays would take 240 MB (and as much again to ship to the server)."""

    step_time_s: np.ndarray | float      # seconds per local step
    upload_bps: np.ndarray | float       # bytes per second
    download_bps: np.ndarray | float

    def round_durations(self, clients: np.ndarray, local_steps: np.ndarray, down_bytes: int,
                        up_bytes: int) -> np.ndarray:
        """Download, then the local steps (one count per client), then upload: virtual seconds for each of `clients`."""
        return (down_bytes / _of(self.download_bps, clients) + local_steps * _of(self.step_time_s, clients)
                + up_bytes / _of(self.upload_bps, clients))


def _of(values: np.ndarray | float, clients: np.ndarray) -> np.ndarray:
    return values[clients] if isinstance(values, np.ndarray) else np.full(len(clients), values)


def make_speeds(num_clients: int, seed: int, *, step_time_s: float, step_time_spread: float,
                upload_bps: float, download_bps: float, bandwidth_spread: float,
                speed_trace: str | None = None) -> ClientSpeeds:
    """Log-normal speeds with the given medians: value * exp(spread * N(0, 1)), drawn once per client
    (spread 0: identical clients), overridden for the clients a speed trace lists. Device speeds in
    FL traces are heavy-tailed; a log-normal is the usual one-parameter stand-in."""
    medians, spreads = (step_time_s, upload_bps, download_bps), (step_time_spread, bandwidth_spread, bandwidth_spread)
    # Row i of the (3, N) standard normals the stream gives, drawn only up to the last row with a spread:
    # a row without one is exactly its median (exp(0 * z) = 1), so it stays one number.
    drawn = max((row + 1 for row, spread in enumerate(spreads) if spread), default=0)
    normal = numpy_rng(seed, Purpose.CLIENT_SPEEDS).standard_normal((drawn, num_clients))
    rows = [median * np.exp(spread * normal[row]) if spread else float(median)
            for row, (median, spread) in enumerate(zip(medians, spreads))]
    if speed_trace is not None:
        rows = [np.full(num_clients, row) if not isinstance(row, np.ndarray) else row for row in rows]
        for client_id, measured in read_speed_trace(speed_trace, num_clients).items():
            for row, value in zip(rows, measured):
                row[client_id] = value
    return ClientSpeeds(step_time_s=rows[0], upload_bps=rows[1], download_bps=rows[2])


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
