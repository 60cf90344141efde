"""The ray engine's round as a Ray compiled graph (ray.dag), against the same round as actor calls.

Each measurement is a fresh process: the engine's actors for `tiny` (FedAvg, N = 1000, S = 100),
the workers' `train` and the server's step with the next round's plan, played for ROUNDS rounds
either as actor calls or as one compiled graph. Printed: the median round and the median time
outside training, the server step and evaluation. Usage:

    python experiments/scaling/compiled_graph.py [REPEATS] [ROUNDS] [WORKERS]
"""
import dataclasses
import os
import statistics
import subprocess
import sys
import time

import ray

import rayfed.engine.ray as engine_ray


class GraphServer(engine_ray.RayServer):
    def step_and_plan(self, round, plan, *results):
        """One value: a compiled graph's node has one output."""
        (metrics, _, next_plan), _ = engine_ray.Server.step_and_plan_next(self, round, plan, *results)
        return metrics, next_plan, self.broadcast()


def measure(workers: int, rounds: int, compiled: bool) -> None:
    from rayfed.api import load_data
    from rayfed.bench.workloads import workload_config
    from rayfed.engine import make_engine
    from rayfed.engine.worker import assign_to_workers
    from rayfed.systems.clients import make_client_systems
    engine_ray.RayServer = GraphServer
    config = workload_config("tiny", rounds, ["engine.backend=ray", f"engine.num_workers={workers}"])
    dataset, partition = load_data(config)
    systems = dataclasses.replace(make_client_systems(config), client_sizes=partition.sizes)
    engine = make_engine(config, dataset, partition, systems)
    server, actors = engine.server.actor, [worker.actor for worker in engine.workers]
    plan, down = ray.get([server.sample.remote(0), server.broadcast.remote()])
    if compiled:
        from ray.dag import InputNode
        with InputNode() as given:          # (round, plan, broadcast, sent_at, each worker's clients)
            results = [actor.call.bind("train", given[0], given[2], given[4 + index], given[3])
                       for index, actor in enumerate(actors)]
            graph = server.step_and_plan.bind(given[0], given[1], *results).experimental_compile()
    rounds_s, outside_s = [], []
    for round in range(rounds):
        started = time.perf_counter()
        per_worker = assign_to_workers(plan.participants, workers, False)
        clients = [per_worker.get(worker, []) for worker in range(workers)]
        if compiled:
            metrics, plan, down = graph.execute(round, plan, down, time.time(), *clients).get()
        else:
            results = [actor.call.remote("train", round, down, ids, time.time()) for actor, ids in zip(actors, clients)]
            metrics, plan, down = ray.get(server.step_and_plan.remote(round, plan, *results))
        elapsed = time.perf_counter() - started
        phases = metrics["phase_s"]
        rounds_s.append(elapsed)
        outside_s.append(elapsed - phases["train"] - phases["server_step"] - phases["eval"])
    if compiled:
        graph.teardown()
    engine.shutdown()
    print(f"{'compiled graph' if compiled else 'actor calls':14s} round {statistics.median(rounds_s[5:]) * 1e3:6.1f} ms"
          f"  outside training, step and evaluation {statistics.median(outside_s[5:]) * 1e3:5.2f} ms", flush=True)


if __name__ == "__main__":
    repeats, rounds, workers = (int(value) for value in (sys.argv[1:] + ["3", "30", "2"][len(sys.argv) - 1:])[:3])
    # Imported by name, not run as __main__, so that Ray's actors import GraphServer from this folder.
    folder = os.path.dirname(os.path.abspath(__file__))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))}
    for _ in range(repeats):
        for mode in ("calls", "compiled"):
            subprocess.run([sys.executable, "-c", f"import compiled_graph; compiled_graph.measure({workers}, {rounds}, "
                            f"{mode == 'compiled'})"], check=True, stderr=subprocess.DEVNULL, env=environment)
