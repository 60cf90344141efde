"""Start-up of runs in one process on one Ray, with engine.reuse_actors: the first run starts its actors, the
next ones build those it kept. `tiny` (N = 1000) on the ray engine with 2 workers, the server an actor (the
bench's `ray`) and in the driver (`ray_driver`). Prints one JSON line per run and a summary line.

    python experiments/scaling/reused_actors.py [RUNS_PER_ENGINE]
"""
import json
import statistics
import sys
import tempfile
import time

import ray

import rayfed
from rayfed.bench.workloads import workload_config
from rayfed.engine.ray import PRIVATE_RAY_CONFIG

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
ENGINES = {"ray": ["engine.server=actor"], "ray_driver": ["engine.server=driver"]}

started = time.perf_counter()
# As a private instance rayfed starts: two CPUs, worker processes that preload rayfed.
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=PRIVATE_RAY_CONFIG)
print(json.dumps({"ray_init_s": round(time.perf_counter() - started, 2)}), flush=True)
startups = {}
with tempfile.TemporaryDirectory() as scratch:
    for engine, overrides in ENGINES.items():
        # Each engine's first run starts its own actors.
        rayfed.release_actors()
        for index in range(RUNS):
            config = workload_config("tiny", 5, ["engine.backend=ray", "engine.num_workers=2",
                                                 "engine.reuse_actors=true", *overrides])
            summary = rayfed.run(config, run_dir=f"{scratch}/{engine}{index}", progress=False).summary
            startups.setdefault(engine, []).append(summary["startup_time_s"])
            print(json.dumps({"engine": engine, "run": index + 1, "startup_s": round(summary["startup_time_s"], 2),
                              "data_s": round(summary["data_time_s"], 2)}), flush=True)
print(json.dumps({engine: {"first_startup_s": round(times[0], 2),
                           "reused_startup_median_s": round(statistics.median(times[1:]), 2)}
                  for engine, times in startups.items()}))
