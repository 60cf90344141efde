"""What a sweep's trial reserves, and so how many trials run at once: no Ray import, for `rayfed sweep
--plan` too."""
from __future__ import annotations

from rayfed.config import Config
from rayfed.engine.server import server_reserved_gpus

# The trial's driver and the server (an actor, or in the driver) mostly wait: a sliver of a CPU each.
DRIVER_CPUS = 0.01


def trial_bundles(config: Config) -> list[dict[str, float]]:
    engine = config.engine

    def bundle(cpus: float, gpus: float) -> dict[str, float]:
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}

    server_gpus = server_reserved_gpus(engine)
    if engine.backend == "local":
        return [bundle(engine.worker_cpus, max(engine.worker_gpus, server_gpus))]
    # A server in the driver computes in the trial's own process, which takes the first bundle.
    servers = ([bundle(DRIVER_CPUS, 0.0), bundle(DRIVER_CPUS, server_gpus)] if engine.server == "actor"
               else [bundle(DRIVER_CPUS, server_gpus)])
    return [*servers, *[bundle(engine.worker_cpus, engine.worker_gpus)] * engine.num_workers]


def trial_slots(bundles: list[dict[str, float]], available: dict[str, float], trials: int) -> int:
    """How many trials of these bundles Tune runs at once on what the cluster has, counted in total (a
    node too small for a bundle aside); at least one, at most `trials`."""
    needed = {}
    for bundle in bundles:
        for kind, amount in bundle.items():
            needed[kind] = needed.get(kind, 0.0) + amount
    # A thousandth's slack: Ray counts resources in ten-thousandths, and 0.01-CPU bundles add up in floats.
    fits = min((int(available.get(kind, 0.0) / amount + 1e-3) for kind, amount in needed.items() if amount > 0),
               default=trials)
    return max(1, min(trials, fits))
