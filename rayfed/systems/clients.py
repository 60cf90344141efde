"""The systems model of the client population: who is online when, and how fast each client is."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.systems.availability import Availability, make_availability
from rayfed.systems.speeds import ClientSpeeds, make_speeds


@dataclass(frozen=True)
class ClientSystems:
    availability: Availability
    speeds: ClientSpeeds
    # Samples per client, once the data is partitioned: local epochs make a client's compute time
    # depend on them.
    client_sizes: np.ndarray | None = None


def make_client_systems(config) -> ClientSystems:
    """Built once on the driver, so that a bad trace file stops the run before anything starts."""
    systems, num_clients = config.systems, config.data.num_clients
    availability = make_availability(systems.availability, num_clients, config.seed,
                                     probability=systems.online_probability,
                                     concentration=systems.online_concentration,
                                     mean_online_s=systems.mean_online_s, mean_offline_s=systems.mean_offline_s,
                                     trace=systems.trace)
    speeds = make_speeds(num_clients, config.seed, step_time_s=systems.step_time_s,
                         step_time_spread=systems.step_time_spread, upload_bps=systems.upload_bps,
                         download_bps=systems.download_bps, bandwidth_spread=systems.bandwidth_spread,
                         speed_trace=systems.speed_trace)
    return ClientSystems(availability, speeds)
