"""The ray engine: the Server as one actor and P ClientWorkers as actors.

The dataset and the partition are put in the object store once and read zero-copy by every
actor on a node. Each round the broadcast is stored once by the server actor and read by
all workers; uploads go from the worker actors straight to the server actor.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import ray

from rayfed.config import Config
from rayfed.data import Dataset, Partition
from rayfed.engine.process_memory import peak_rss
from rayfed.engine.server import Server
from rayfed.engine.worker import ClientWorker
from rayfed.errors import ConfigError
from rayfed.systems.clients import ClientSystems


class RemoteHandle:
    """Calls methods of a Ray actor: `handle.step(...)` returns an ObjectRef."""

    def __init__(self, actor: Any):
        self.actor = actor

    def __getattr__(self, name: str) -> Callable:
        method = getattr(self.actor, name)
        return lambda *args, **kwargs: method.remote(*args, **kwargs)


class RayClientWorker:
    """A ClientWorker as a restartable Ray actor. Its constructor takes no objects from the store
    (Ray cannot guarantee those for a restart, and says so on every run, ray#53727): the engine
    hands it the shared data with `attach`, after creation and again after a restart."""

    def __init__(self, config: Config, input_shape: tuple[int, ...], num_classes: int, worker_index: int,
                 num_workers: int):
        self.arguments = (config, input_shape, num_classes, worker_index, num_workers)
        self.worker: ClientWorker | None = None

    def attach(self, data_refs: list) -> None:
        """`data_refs` = [train data, partition]: references inside a list, so Ray passes them unresolved."""
        config, input_shape, num_classes, worker_index, num_workers = self.arguments
        train_data, partition = ray.get(data_refs)
        self.worker = ClientWorker(config, train_data, partition, input_shape, num_classes, worker_index, num_workers)

    def train_with_status(self, round: int, down, client_ids: list[int]):
        """A tiny status beside the result, so the driver can tell a late or dead worker without
        fetching its uploads (which go to the server actor directly)."""
        return True, self.worker.train(round, down, client_ids)

    def commit(self) -> None:
        self.worker.commit()

    def discard(self) -> None:
        self.worker.discard()

    def snapshot_client_states(self) -> dict:
        return self.worker.snapshot_client_states()

    def restore_client_states(self, states: dict) -> None:
        self.worker.restore_client_states(states)

    def client_state_bytes(self) -> int:
        return self.worker.client_state_bytes()

    def peak_rss(self) -> tuple[int, int]:
        return peak_rss()


class WorkerHandle(RemoteHandle):
    def train(self, round: int, down, client_ids: list[int]):
        return self.actor.train_with_status.options(num_returns=2).remote(round, down, client_ids)


# A worker whose process is gone, or that Ray cannot reach while restarting it.
ACTOR_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


class RayEngine:
    def __init__(self, config: Config, dataset: Dataset, partition: Partition, client_systems: ClientSystems):
        engine = config.engine
        self.started_ray = _connect(engine.address, engine.num_workers * engine.worker_cpus)
        try:
            _check_resources(config)
            self._start_actors(config, dataset, partition, client_systems)
        except BaseException:
            if self.started_ray:
                ray.shutdown()
            raise

    def _start_actors(self, config: Config, dataset: Dataset, partition: Partition,
                      client_systems: ClientSystems) -> None:
        engine = config.engine
        # Held for the engine's lifetime: a restarted worker is attached to these same objects.
        self.train_ref = train_ref = ray.put((dataset.train_x, dataset.train_y))
        self.partition_ref = partition_ref = ray.put(partition)
        # The server works while the workers wait for the next round, so it reserves no CPU:
        # otherwise P one-CPU workers could not all be placed on a P-core machine.
        server_actor = ray.remote(Server).options(num_cpus=0, num_gpus=engine.server_gpus, max_restarts=0)
        worker_actor = ray.remote(RayClientWorker).options(num_cpus=engine.worker_cpus, num_gpus=engine.worker_gpus,
                                                           max_restarts=engine.worker_max_restarts)
        self.server = RemoteHandle(server_actor.remote(config, (dataset.test_x, dataset.test_y),
                                                       dataset.input_shape, dataset.num_classes, client_systems))
        self.round_timeout_s = engine.round_timeout_s
        self.workers = [
            WorkerHandle(worker_actor.remote(config, dataset.input_shape, dataset.num_classes, index,
                                             engine.num_workers))
            for index in range(engine.num_workers)
        ]
        # Actors start asynchronously; waiting here puts their start-up (and any error in their
        # constructors) before the first round rather than inside it.
        ray.get([self.server.actor.__ray_ready__.remote(),
                 *(handle.actor.attach.remote([train_ref, partition_ref]) for handle in self.workers)])

    def get(self, ref):
        return ray.get(ref)

    def settle(self, calls: dict[int, tuple]) -> tuple[dict[int, Any], dict[int, str]]:
        """Waits up to engine.round_timeout_s for the workers' statuses; returns the delivered results
        by worker, and the workers that were late or died this round."""
        worker_of = {status: worker for worker, (status, _) in calls.items()}
        ready, _ = ray.wait(list(worker_of), num_returns=len(worker_of), timeout=self.round_timeout_s)
        delivered, failed = {}, {worker: "late" for worker in calls}
        for status in ready:
            worker = worker_of[status]
            try:
                ray.get(status)
            except ACTOR_LOST:
                failed[worker] = "died"
                continue
            delivered[worker] = calls[worker][1]
            del failed[worker]
        return delivered, failed

    def revive(self, workers: list[int], timeout_s: float = 120.0) -> list[int]:
        """Waits for restarted workers to answer again (calls made while Ray restarts an actor fail)
        and re-attaches them to their shard; returns those that came back: a worker out of restarts
        stays gone, and its clients with it."""
        deadline = time.monotonic() + timeout_s
        alive = []
        for worker in workers:
            while time.monotonic() < deadline:
                try:
                    ray.get(self.workers[worker].actor.attach.remote([self.train_ref, self.partition_ref]))
                except ACTOR_LOST:
                    time.sleep(0.5)
                    continue
                alive.append(worker)
                break
        return alive

    def shutdown(self) -> None:
        for handle in (self.server, *self.workers):
            ray.kill(handle.actor)
        if self.started_ray:
            ray.shutdown()


def _connect(address: str | None, cpus_needed: float) -> bool:
    """Joins the cluster at `address` (or RAY_ADDRESS, as under `ray job submit`), reuses a Ray
    already initialised in this process, or starts a private local instance. Returns whether
    this call started Ray (and so must stop it)."""
    if ray.is_initialized():
        return False
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, ValueError, RuntimeError) as error:
            raise ConfigError(f"engine.address={address}: cannot join the Ray cluster ({error})") from None
        return True
    # A private instance sized so that all workers fit even when they oversubscribe the cores.
    num_cpus = max(os.cpu_count() or 1, int(cpus_needed + 0.999))
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **quiet)
    return True


def _check_resources(config: Config) -> None:
    engine = config.engine
    available = ray.cluster_resources()
    needs = {"CPU": (engine.num_workers * engine.worker_cpus, f"engine.num_workers={engine.num_workers} x "
                                                                 f"engine.worker_cpus"),
             "GPU": (engine.num_workers * engine.worker_gpus + engine.server_gpus,
                     f"engine.num_workers={engine.num_workers} x engine.worker_gpus + engine.server_gpus")}
    for resource, (needed, keys) in needs.items():
        if needed > available.get(resource, 0.0) + 1e-9:
            raise ConfigError(f"{keys} needs {needed:g} {resource}s but the Ray cluster has "
                              f"{available.get(resource, 0.0):g}")
