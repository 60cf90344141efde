"""The ray engine: the Server as one actor (or, with engine.server=driver, in the driver's process) and
P ClientWorkers as actors.

The dataset and the partition are put in the object store once and read zero-copy by every
actor on a node (an on-demand dataset's source instead, a few numbers). Each round the broadcast
is stored once by the server actor and read by all workers; uploads go from the worker actors
straight to the server actor, whose step the driver sends before they arrive and which plans the
next round (rayfed.engine.loop). A server in the driver steps on the uploads as they come back to
it, and a small broadcast goes to the workers with their calls. The actors are built for a run after
they start, so that a later run in this process may build them again (rayfed.engine.actor_pool).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable

import ray
import torch
from ray._private import services
from ray._private import state as ray_state
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfed.config import Config
from rayfed.data import Dataset, Partition
from rayfed.data.lazy import is_lazy
import rayfed.engine.actor_pool as actor_pool
from rayfed.engine.client_data import worker_data
from rayfed.engine.gpu_share import sharing_groups
from rayfed.engine.lost import ServerLost, WorkerLost
from rayfed.engine.messages import Broadcast
from rayfed.engine.process_memory import reset_peak_rss
from rayfed.engine.ray_copies import RelayedCopies, existing_relay
from rayfed.engine.ray_memory import MemoryProbe, run_pss
from rayfed.engine.server import Server, clients_train_data, server_reserved_gpus, server_share
from rayfed.engine.state_store import SpillFailed, StateStorage
from rayfed.engine.worker import ClientWorker
from rayfed.errors import ConfigError, first_line
from rayfed.faults import SERVER, Fault, enact
from rayfed.plugins import install_plugins, shippable_plugins
from rayfed.provenance import CAPS, check_actor_cpu_isa
from rayfed.registry import Entry
from rayfed.systems.clients import ClientSystems


class DriverServer:
    """The Server in the driver's process (engine.server=driver): a call runs at once and returns its
    value. The workers' results it takes are fetched first, a lost worker reported as the engine
    reports it; the broadcast it returns goes to the workers with their calls, or, when large, through
    the object store once (BROADCAST_WITH_CALL_BYTES)."""

    def __init__(self, server: Server, get: Callable):
        self.target = server
        self.get = get

    def __getattr__(self, name: str) -> Callable:
        method = getattr(self.target, name)
        return lambda *args, **kwargs: method(*self._values(args), **kwargs)

    def _values(self, args: tuple) -> list:
        """`args` with the object references among them fetched, all at once."""
        values = list(args)
        at = [index for index, arg in enumerate(args) if isinstance(arg, ray.ObjectRef)]
        if at:
            for index, value in zip(at, self.get([args[index] for index in at])):
                values[index] = value
        return values

    def broadcast(self):
        return _shipped(self.target.broadcast())

    def step_and_plan_next(self, *args, **kwargs):
        stepped, down = self.target.step_and_plan_next(*self._values(args), **kwargs)
        return stepped, None if down is None else _shipped(down)


# Up to this size a broadcast goes with each worker's call, a few ms a round less than a store round trip on a
# small machine; above it it is stored once for all workers. Ray's default bound for an argument carried with the
# call, which a cluster rayfed joins may keep: above it Ray would store the broadcast once per worker's call.
BROADCAST_WITH_CALL_BYTES = 100 * 1024


def _shipped(down: Broadcast):
    return down if down.nbytes <= BROADCAST_WITH_CALL_BYTES else ray.put(down)


class WorkerRestarted(Exception):
    """Raised by a worker that Ray restarted: it has no shard or client states until the engine
    attaches it again. It names its actor, which the engine knows by its index."""

    def __init__(self, actor_id: str):
        super().__init__(actor_id)
        self.actor_id = actor_id


@dataclasses.dataclass
class WorkerArguments:
    """What builds a run's ClientWorker in an actor, besides the shared data."""

    plugins: list[Entry]
    config: Config
    input_shape: tuple[int, ...]
    num_classes: int
    worker_index: int
    num_workers: int
    storage: StateStorage


class RayClientWorker(MemoryProbe):
    """A ClientWorker as a restartable Ray actor. It takes its run's arguments and the shared data with
    `attach`, after creation, again after a restart, and when a later run reuses it (engine.reuse_actors);
    its constructor takes nothing, so a restart brings back nothing of another run, and Ray never
    passes it objects from the store (it cannot guarantee those for a restart, and says so on every
    run, ray#53727). Every ClientWorker method is reached through `call`, so a worker method added for
    a feature needs no forwarder here."""

    def __init__(self):
        self.worker: ClientWorker | None = None

    def attach(self, arguments: WorkerArguments, data_refs: list, fault: Fault | None = None) -> None:
        """`data_refs` = [train data, partition]: references inside a list, so Ray passes them unresolved.
        `fault` is enacted once attached: a worker that dies while it is being restarted."""
        check_actor_cpu_isa(arguments.config.engine.cpu_isa, f"worker {arguments.worker_index}")
        install_plugins(arguments.plugins)
        train_data, partition = ray.get(data_refs)
        # An earlier run's worker goes before this one is built: the two never hold their states at once.
        self.worker = None
        self.worker = ClientWorker(arguments.config, train_data, partition, arguments.input_shape,
                                   arguments.num_classes, arguments.worker_index, arguments.num_workers,
                                   arguments.storage)
        if fault is not None:
            enact(fault)

    def attached(self) -> ClientWorker:
        if self.worker is None:
            raise WorkerRestarted(ray.get_runtime_context().get_actor_id())
        return self.worker

    def call(self, method: str, *args):
        """The attached ClientWorker's `method`; a worker Ray restarted raises WorkerRestarted."""
        return getattr(self.attached(), method)(*args)

    def call_with_status(self, method: str, *args):
        """`call`, with a tiny status beside the result, so the driver can tell a late or dead worker
        without fetching its uploads (which go to the server directly)."""
        return True, self.call(method, *args)

    def enact(self, fault: Fault) -> None:
        enact(fault)

    def remove_live_shard(self, arguments: WorkerArguments) -> None:
        """The run ended: this worker's live shard of spilled states, on a node the driver may not reach."""
        arguments.storage.remove_files(arguments.num_workers, [arguments.worker_index])

    def detach(self) -> None:
        """The run ended and a later one may reuse this actor: its worker (clients' states, the run's data) goes,
        and its peak memory starts over."""
        self.worker = None
        let_go()


class RayServer(MemoryProbe):
    """The Server as a Ray actor, built for a run by `build`, after creation or when a later run reuses it
    (engine.reuse_actors). Every Server method is reached through `call`."""

    def __init__(self):
        self.server: Server | None = None

    def build(self, plugins: list[Entry], config: Config, *arguments) -> None:
        check_actor_cpu_isa(config.engine.cpu_isa, "the server")
        install_plugins(plugins)
        self.server = None
        self.server = Server(config, *arguments)

    def call(self, method: str, *args, **kwargs):
        return getattr(self.server, method)(*args, **kwargs)

    @ray.method(num_returns=2)
    def step_and_plan_next(self, *arguments, **keywords):
        """Two objects: the driver reads the metrics and the plan, and hands the workers the
        broadcast's reference, so it goes from the server's store to theirs."""
        return self.server.step_and_plan_next(*arguments, **keywords)

    def enact(self, fault: Fault) -> None:
        enact(fault)

    def detach(self) -> None:
        """The run ended and a later one may reuse this actor: its server goes, and its peak memory starts over."""
        self.server = None
        let_go()


def let_go() -> None:
    """An idle actor's memory back to the node: the run's objects freed now (cycles included), its cached and
    shared GPU blocks returned; its peak resident set starts over for the next run's figures."""
    gc.collect()
    if torch.cuda.is_initialized():
        # Blocks another worker mapped (rayfed.engine.gpu_share) wait for this collection, not for empty_cache.
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()
    reset_peak_rss()


class ServerHandle:
    """Calls the Server methods of a RayServer: `handle.sample(round)` returns an ObjectRef. `built`: what
    the actor's build answers, a run's server error raised there."""

    def __init__(self, actor: Any, built: ray.ObjectRef):
        self.actor = actor
        self.built = built

    def __getattr__(self, name: str) -> Callable:
        return lambda *args, **kwargs: self.actor.call.remote(name, *args, **kwargs)

    def step_and_plan_next(self, *args, **kwargs):
        return self.actor.step_and_plan_next.remote(*args, **kwargs)


class WorkerHandle:
    """Calls the ClientWorker methods of a RayClientWorker: `handle.commit()` returns an ObjectRef."""

    def __init__(self, actor: Any):
        self.actor = actor

    def __getattr__(self, name: str) -> Callable:
        return lambda *args: self.actor.call.remote(name, *args)

    def train(self, round: int, down, client_ids: list[int], sent_at: float):
        return self.actor.call_with_status.options(num_returns=2).remote("train", round, down, client_ids, sent_at)


# A worker whose process is gone, or that Ray cannot reach while restarting it.
ACTOR_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
# How long a restarted actor may take to answer again: a new process that imports torch.
REVIVE_TIMEOUT_S = 120.0
# A call can fail while its actor stays up (no restart follows): after this long, attach to it as it is.
SAME_INCARNATION_S = 10.0
# How long the engine's shutdown waits for the workers to remove their live shards (a dead one cannot).
LIVE_SHARD_REMOVAL_S = 10.0
# How long a finished run waits for its actors to let go of it (engine.reuse_actors): one that does not answer
# by then is ended instead of kept.
DETACH_TIMEOUT_S = 10.0


class RayEngine:
    def __init__(self, config: Config, dataset: Dataset, partition: Partition, client_systems: ClientSystems,
                 storage: StateStorage):
        engine = config.engine
        # A server in the driver sets this process's torch threads for the run; the driver gets its own back.
        self.saved_threads = torch.get_num_threads()
        self.started_ray = connect_ray(engine.address, engine.num_workers * engine.worker_cpus,
                                    engine.connect_timeout_s)
        try:
            _check_resources(config)
            self._start_actors(config, dataset, partition, client_systems, storage)
        except BaseException:
            torch.set_num_threads(self.saved_threads)
            if self.started_ray:
                ray.shutdown()
            raise

    def _start_actors(self, config: Config, dataset: Dataset, partition: Partition, client_systems: ClientSystems,
                      storage: StateStorage) -> None:
        engine = config.engine
        # The plugins' registrations go to every actor, installed before it builds anything; from
        # here on their modules pickle by value (a plugin's on-demand source among them).
        plugins = shippable_plugins()
        # Held for the engine's lifetime: a restarted worker is attached to these same objects. An
        # on-demand dataset puts only its source: each worker makes its clients' samples itself.
        train_data, worker_partition = worker_data(dataset, partition)
        self.train_ref = train_ref = ray.put(train_data)
        self.partition_ref = partition_ref = ray.put(worker_partition)
        test_ref = ray.put((dataset.test_x, dataset.test_y))
        # The driver goes on with the store's copy instead of its own: the node holds the data once.
        stored_train, (dataset.test_x, dataset.test_y) = ray.get([train_ref, test_ref])
        if not is_lazy(dataset):
            dataset.train_x, dataset.train_y = stored_train
        # engine.reuse_actors: the last run's idle actors of the same options serve this one, and any other idle
        # ones end, freeing what they hold. Only on a Ray that outlives the run, outside a sweep's trial (whose
        # placement group ends with it).
        self.reuse = engine.reuse_actors and not self.started_ray and not _in_placement_group()
        self.worker_key = ("worker", engine.worker_cpus, engine.worker_gpus, engine.worker_max_restarts,
                           engine.placement, engine.cpu_isa)
        reused_workers = _take_sound(self.worker_key, engine.num_workers) if self.reuse else []
        if engine.server == "driver":
            clients_train = clients_train_data(config, dataset, partition)
            self.new_server = lambda: DriverServer(Server(config, (dataset.test_x, dataset.test_y), dataset.input_shape,
                                                          dataset.num_classes, client_systems, clients_train), self.get)
        else:
            # The server works while the workers wait for the next round, so it reserves no CPU:
            # otherwise P one-CPU workers could not all be placed on a P-core machine. Ray does not
            # restart it: the engine recreates it from the last checkpoint (recreate_server).
            reserved_gpus = server_reserved_gpus(engine)
            placement = _server_placement(reserved_gpus)
            # The GPU share it computes with is in the key: a server that ran on a GPU set its process's CUDA state.
            self.server_key = ("server", reserved_gpus, server_share(engine),
                               getattr(placement.get("scheduling_strategy"), "node_id", None), engine.cpu_isa)
            server_actor = ray.remote(RayServer).options(num_cpus=0, num_gpus=reserved_gpus, max_restarts=0,
                                                         **placement, **_capped(engine.cpu_isa))
            # References, not values: Ray would store a copy of the values for each server it builds,
            # and the driver would keep its own for the engine's lifetime.
            server_arguments = (plugins, config, test_ref, dataset.input_shape, dataset.num_classes, client_systems,
                                ray.put(clients_train_data(config, dataset, partition)))
            reused_server = _take_sound(self.server_key, 1) if self.reuse else []

            def new_server() -> ServerHandle:
                actor = reused_server.pop() if reused_server else server_actor.remote()
                return ServerHandle(actor, actor.build.remote(*server_arguments))
            self.new_server = new_server
        actor_pool.release_actors()
        # The checkpoint's copies of spilled shards of workers away from the driver's node go through a relay
        # there, so the run needs no file system that the nodes share. The workers keep their live shards on
        # their own nodes, and remove them when the run ends.
        self.relay_name = f"rayfed-copy-relay-{uuid.uuid4().hex}"
        self.spilled = storage.spilled
        storage = dataclasses.replace(storage, copies=RelayedCopies(ray.get_runtime_context().get_node_id(),
                                                                    self.relay_name))
        worker_actor = ray.remote(RayClientWorker).options(num_cpus=engine.worker_cpus, num_gpus=engine.worker_gpus,
                                                           max_restarts=engine.worker_max_restarts,
                                                           **_worker_placement(engine.placement),
                                                           **_capped(engine.cpu_isa))
        self.round_timeout_s = engine.round_timeout_s
        self.restarts_seen = [0] * engine.num_workers
        self.max_restarts = engine.worker_max_restarts
        self.worker_arguments = [WorkerArguments(plugins, config, dataset.input_shape, dataset.num_classes, index,
                                                 engine.num_workers, storage)
                                 for index in range(engine.num_workers)]
        self.workers = [WorkerHandle(reused_workers[index] if index < len(reused_workers) else worker_actor.remote())
                        for index in range(engine.num_workers)]
        # A server in the driver is built while the workers start.
        self.server = self.new_server()
        # Actors start asynchronously; waiting here puts their start-up (and any error in building them)
        # before the first round rather than inside it.
        self.get([*self._server_built(),
                  *(handle.actor.attach.remote(arguments, [train_ref, partition_ref])
                    for handle, arguments in zip(self.workers, self.worker_arguments))])
        if engine.worker_gpus and not is_lazy(dataset):
            self._share_training_arrays()

    def _share_training_arrays(self) -> None:
        """Workers on the same GPU train on one copy of the training arrays (rayfed.engine.gpu_share); an on-demand
        dataset keeps none resident."""
        identities = ray.get([handle.actor.call.remote("gpu_identity") for handle in self.workers])
        for first, *others in sharing_groups(identities):
            exporter = self.workers[first].actor
            for index in others:
                handles = ray.get(exporter.call.remote("export_training_arrays"))
                problem = ray.get(self.workers[index].actor.call.remote("map_training_arrays", handles))
                if problem is not None:
                    print(f"rayfed: engine.worker_gpus: workers on one GPU cannot share the training set "
                          f"({problem}); each moves its own copy there", file=sys.stderr)
                    return

    def _server_actor(self) -> list:
        """[the server's actor], or [] where the server runs in the driver."""
        return [self.server.actor] if isinstance(self.server, ServerHandle) else []

    def _server_built(self) -> list:
        """[the reference that the server actor's build answers], or [] where the server runs in the driver."""
        return [self.server.built] if isinstance(self.server, ServerHandle) else []

    def get(self, ref):
        if not _is_reference(ref):
            return ref
        try:
            return ray.get(ref)
        except (WorkerRestarted, *ACTOR_LOST) as error:
            raise self._lost(error) from None
        except ray.exceptions.RayTaskError as error:
            raise _one_line(error) from None

    def _lost(self, error: Exception) -> Exception:
        """The loss to report for a failed call: by the actor Ray names, or, when it names none, by
        what the cluster's actor table says of ours; the error itself when that finds none."""
        actor_id = error.actor_id
        for server in self._server_actor():
            if actor_id == server._actor_id.hex() or (actor_id is None and _actor_state(server)[0] != "ALIVE"):
                return ServerLost()
        for index, handle in enumerate(self.workers):
            if actor_id == handle.actor._actor_id.hex():
                return WorkerLost([index])
        changed = [index for index, handle in enumerate(self.workers)
                   if _actor_state(handle.actor) != ("ALIVE", self.restarts_seen[index])]
        return WorkerLost(changed) if changed else error

    def settle(self, calls: dict[int, tuple], wait: bool) -> tuple[dict[int, Any], dict[int, str]]:
        """Waits up to engine.round_timeout_s for the workers' statuses; returns the delivered results
        by worker, and the workers that were late or died this round. Without `wait` and a timeout,
        every worker's result, unresolved: whoever uses them waits for them."""
        if not wait and self.round_timeout_s is None:
            return {worker: result for worker, (_, result) in calls.items()}, {}
        worker_of = {status: worker for worker, (status, _) in calls.items()}
        ready, _ = ray.wait(list(worker_of), num_returns=len(worker_of), timeout=self.round_timeout_s)
        delivered, failed = {}, {worker: "late" for worker in calls}
        for status in ready:
            worker = worker_of[status]
            try:
                ray.get(status)
            except (*ACTOR_LOST, WorkerRestarted):
                failed[worker] = "died"
                # Its result holds the same error, which Ray prints as unhandled unless it is read.
                with contextlib.suppress(*ACTOR_LOST, WorkerRestarted):
                    ray.get(calls[worker][1])
                continue
            except ray.exceptions.RayTaskError as error:
                raise _one_line(error) from None
            delivered[worker] = calls[worker][1]
            del failed[worker]
        return delivered, failed

    def revive(self, workers: list[int], faults: dict[int, Fault]) -> tuple[list[int], dict[int, str]]:
        """Waits until Ray has restarted `workers` and attaches each to its shard again, enacting its
        fault in `faults` during that attach. Returns the workers back, and those that will not come
        back with why: out of engine.worker_max_restarts, or no node with room for them (their node
        died and the others are full)."""
        alive, gone = [], {}
        for worker in workers:
            fault = faults.get(worker)
            started = time.monotonic()
            while worker not in alive and worker not in gone:
                state, restarts = _actor_state(self.workers[worker].actor)
                waited_s = time.monotonic() - started
                if state == "DEAD":
                    gone[worker] = f"died more than engine.worker_max_restarts={self.max_restarts} times"
                elif waited_s > REVIVE_TIMEOUT_S:
                    gone[worker] = f"died and Ray found no node with room to restart it within {REVIVE_TIMEOUT_S:g} s"
                elif state == "ALIVE" and (restarts > self.restarts_seen[worker] or waited_s > SAME_INCARNATION_S):
                    # Calls to an actor Ray is still restarting can be dropped: only a new incarnation
                    # (or one that never died) is sure to receive the attach and its fault.
                    if self._attach(worker, fault):
                        alive.append(worker)
                        self.restarts_seen[worker] = restarts
                    fault = None
                else:
                    time.sleep(0.2)
        return alive, gone

    def _attach(self, worker: int, fault: Fault | None) -> bool:
        try:
            ray.get(self.workers[worker].actor.attach.remote(self.worker_arguments[worker],
                                                             [self.train_ref, self.partition_ref], fault))
            return True
        except ACTOR_LOST:
            return False

    def process_pss(self) -> dict[str, int] | None:
        return run_pss(self._named_actors())

    def _named_actors(self) -> dict[str, Any]:
        """The run's actors, by the names the PSS report gives them."""
        named = dict(zip(["server"], self._server_actor()))
        named.update({f"worker {index}": handle.actor for index, handle in enumerate(self.workers)})
        relay = existing_relay(self.relay_name) if self.spilled else None
        if relay is not None:
            named["copy relay"] = relay
        return named

    def recreate_server(self) -> None:
        for server in self._server_actor():
            ray.kill(server, no_restart=True)
        # The old server goes before the new one is built: the two never hold their state at once.
        self.server = None
        self.server = self.new_server()
        for built in self._server_built():
            self.get(built)

    def enact(self, target: int, fault: Fault) -> None:
        (self._server_actor()[0] if target == SERVER else self.workers[target].actor).enact.remote(fault)

    def _keep_healthy_actors(self) -> set:
        """Keeps the run's server and workers that never died and let go of the run's objects in time for the
        next run (engine.reuse_actors); returns their actor ids."""
        groups = [(self.worker_key, _sound([handle.actor for handle in self.workers]))]
        if self._server_actor():
            groups.append((self.server_key, _sound(self._server_actor())))
        detached = {actor.detach.remote(): actor for _, actors in groups for actor in actors}
        ready, _ = ray.wait(list(detached), num_returns=len(detached), timeout=DETACH_TIMEOUT_S)
        kept = {detached[reference]._actor_id for reference in ready}
        for key, actors in groups:
            actor_pool.keep(key, [actor for actor in actors if actor._actor_id in kept])
        return kept

    def shutdown(self, finished: bool = False) -> None:
        """`finished`: the run played its rounds (or a callback ended it), so its actors are idle: with
        engine.reuse_actors they are kept. Those of a run that failed or was stopped may be busy or broken."""
        try:
            if self.spilled:
                # Live shards on other nodes than the driver's, which the driver cannot remove (it removes its node's).
                driver_node = ray.get_runtime_context().get_node_id()
                away = [(handle.actor, arguments) for handle, arguments in zip(self.workers, self.worker_arguments)
                        if _actor_node(handle.actor) != driver_node]
                ray.wait([actor.remove_live_shard.remote(arguments) for actor, arguments in away],
                         num_returns=len(away), timeout=LIVE_SHARD_REMOVAL_S)
            kept = self._keep_healthy_actors() if self.reuse and finished else set()
            for actor in self._named_actors().values():
                if actor._actor_id not in kept:
                    ray.kill(actor)
        finally:
            torch.set_num_threads(self.saved_threads)
            if self.started_ray:
                ray.shutdown()


def _is_reference(value: Any) -> bool:
    """An object reference, or a list holding one (ray.get refuses a list that mixes them with values); anything
    else is a value (a server in the driver answers with values)."""
    if isinstance(value, list):
        return any(isinstance(item, ray.ObjectRef) for item in value)
    return isinstance(value, ray.ObjectRef)


def _one_line(error: ray.exceptions.RayTaskError) -> Exception:
    """A rayfed error raised in an actor as the driver would have raised it (one line for the
    user); any other error as Ray reports it, with the actor's traceback."""
    return error.cause if isinstance(error.cause, (ConfigError, SpillFailed)) else error


def _in_placement_group() -> bool:
    """A sweep's trial: Tune placed the driver in a placement group that its actors join (Ray captures them), which
    an explicit scheduling strategy would take them out of."""
    return ray.util.get_current_placement_group() is not None


def _server_placement(server_gpus: float) -> dict:
    """The server on the driver's node, whose loss ends the run anyway: a worker node that dies never takes the
    server with it. Pinned (Ray's soft affinity often places it elsewhere); a server that reserves GPUs goes wherever
    Ray finds them, since the driver's node may have none."""
    if server_gpus or _in_placement_group():
        return {}
    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}


def _capped(cpu_isa: str | None) -> dict:
    """engine.cpu_isa's caps in an actor's environment from its process's start: PyTorch, MKL and oneDNN read
    them at their first computation there. A worker Ray restarts, on any node, starts with them too."""
    return {} if cpu_isa is None else {"runtime_env": {"env_vars": CAPS[cpu_isa]}}


def _worker_placement(placement: str) -> dict:
    if placement == "default" or _in_placement_group():
        return {}
    return {"scheduling_strategy": "SPREAD"}


def _take_sound(key: tuple, count: int) -> list:
    """Up to `count` kept actors of the options `key` that are alive and never died; any that Ray restarted
    while it waited (its node gone, its process killed) ends."""
    taken = actor_pool.take(key, count)
    sound = _sound(taken)
    kept = {actor._actor_id for actor in sound}
    for actor in taken:
        if actor._actor_id not in kept:
            ray.kill(actor)
    return sound


def _sound(actors: list) -> list:
    """The actors that are alive and never died: a kept actor whose node has gone since is not."""
    return [actor for actor in actors if _actor_state(actor) == ("ALIVE", 0)]


def _actor_state(actor) -> tuple[str, int]:
    """The actor's state in the cluster's actor table (ALIVE, RESTARTING, DEAD, ...) and how often
    Ray has restarted it."""
    entry = _actor_entry(actor)
    return entry.get("State", "UNKNOWN"), int(entry.get("NumRestarts", 0))


def _actor_node(actor) -> str | None:
    """The node the actor runs on (or last ran on), as the cluster's actor table has it."""
    return _actor_entry(actor).get("Address", {}).get("NodeID")


def _actor_entry(actor) -> dict:
    return ray_state.actors(actor._actor_id.hex()) or {}


# How rayfed starts a private Ray instance. Its worker processes import rayfed (and so torch) while
# they wait for work, so that creating an actor is its constructor, not seconds of imports; and a
# message up to 1 MiB (a small model's broadcast and a worker's uploads) travels with the call
# instead of through the object store, a few ms less per round on a small machine. On a cluster
# that rayfed joins, `ray start` sets these (docs/tutorials/cluster.md).
PRIVATE_RAY_CONFIG = {"preload_python_modules": ["rayfed.engine.ray"], "max_direct_call_object_size": 2**20}


def connect_ray(address: str | None, cpus_needed: float, timeout_s: float, whole_machine: bool = False,
                env_vars: dict[str, str] | None = None) -> bool:
    """Joins the cluster at `address` (or RAY_ADDRESS, as under `ray job submit`), reuses a Ray
    already initialised in this process, or starts a private local instance. Returns whether
    this call started Ray (and so must stop it). A private instance has `cpus_needed` CPUs, or with
    `whole_machine` (a sweep's trials, side by side) at least the machine's. `env_vars`: in the
    environment of every process of the job that this call starts (not of a Ray it reuses)."""
    if ray.is_initialized():
        return False
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False,
                 **({"runtime_env": {"env_vars": env_vars}} if env_vars else {}))
    key = "engine.address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    # ray.init replaces the SIGTERM handler; rayfed's own stops a run cleanly.
    sigterm_handler = signal.getsignal(signal.SIGTERM)
    try:
        if address:
            _probe(key, address, timeout_s)
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, ValueError, RuntimeError) as error:
                raise ConfigError(f"{key}={address}: cannot join the Ray cluster ({first_line(error)})") from None
            return True
        # All workers fit even when they oversubscribe the cores. No more: Ray starts one worker process per CPU
        # ahead, each importing rayfed and PyTorch, and a run's unused ones held 2.7-4.7 GB on a 16-core machine.
        num_cpus = max((os.cpu_count() or 1) if whole_machine else 1, int(cpus_needed + 0.999))
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _system_config=PRIVATE_RAY_CONFIG,
                 **quiet)
        return True
    finally:
        if threading.current_thread() is threading.main_thread() and sigterm_handler is not None:
            signal.signal(signal.SIGTERM, sigterm_handler)


def _probe(key: str, address: str, timeout_s: float) -> None:
    """ray.init waits forever, deaf to SIGTERM, for a cluster that is not there; a TCP connection
    to where it would connect, bounded in time, finds that out first."""
    try:
        target = address.partition("://")[2] if "://" in address else services.canonicalize_bootstrap_address(
            address)
    except (ConnectionError, ValueError) as error:
        raise ConfigError(f"{key}={address}: {first_line(error)}") from None
    host, _, port = (target or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}={address}: a Ray address is HOST:PORT (or ray://HOST:PORT, auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, socket.timeout) else (error.strerror or type(error).__name__)
        raise ConfigError(f"{key}={address}: no Ray cluster answers at {host}:{port} within "
                          f"engine.connect_timeout_s={timeout_s:g} s ({reason}); start one with "
                          f"`ray start --head`, or fix the address") from None


def _check_resources(config: Config) -> None:
    engine = config.engine
    available = ray.cluster_resources()
    # A server in the driver computes on the driver's GPU, as the local engine does: Ray places only actors.
    server_gpus = server_reserved_gpus(engine) if engine.server == "actor" else 0.0
    server_key = " + engine.server_gpus" if server_gpus else ""
    needs = {"CPU": (engine.num_workers * engine.worker_cpus, f"engine.num_workers={engine.num_workers} x "
                                                                 f"engine.worker_cpus"),
             "GPU": (engine.num_workers * engine.worker_gpus + server_gpus,
                     f"engine.num_workers={engine.num_workers} x engine.worker_gpus{server_key}")}
    for resource, (needed, keys) in needs.items():
        if needed > available.get(resource, 0.0) + 1e-9:
            raise ConfigError(f"{keys} needs {needed:g} {resource}s but the Ray cluster has "
                              f"{available.get(resource, 0.0):g}")
    # Enough CPUs in all can still be too few on every node for one worker: Ray would wait for a node forever.
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    fit = sum(_workers_fitting(node, engine.worker_cpus, engine.worker_gpus) for node in nodes)
    if fit < engine.num_workers:
        gpus = f" and {engine.worker_gpus:g} GPUs (engine.worker_gpus)" if engine.worker_gpus else ""
        sizes = ", ".join(f"{node.get('CPU', 0.0):g}" + (f"+{node.get('GPU', 0.0):g} GPU" if engine.worker_gpus else "")
                          for node in nodes)
        raise ConfigError(f"engine.num_workers={engine.num_workers} workers of {engine.worker_cpus:g} CPUs "
                          f"(engine.worker_cpus){gpus} do not fit on the Ray cluster's nodes: they hold {fit} "
                          f"(CPUs a node: {sizes})")


def _workers_fitting(node: dict[str, float], cpus: float, gpus: float) -> int:
    """How many workers of `cpus` CPUs and `gpus` GPUs the node's resources hold."""
    fit = math.floor(node.get("CPU", 0.0) / cpus + 1e-9)
    return min(fit, math.floor(node.get("GPU", 0.0) / gpus + 1e-9)) if gpus else fit
