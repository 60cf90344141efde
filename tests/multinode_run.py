"""Runs on a Ray cluster of several nodes on this machine (ray.cluster_utils.Cluster: one raylet and
object store per node), each beside the same run on the local engine: `python -m tests.multinode_run SPEC`.

A process of its own, since a process holds one Ray connection and the tests' session already holds
one. The scenarios share the process, its head node and their local runs: a head and an interpreter
that imports Ray and PyTorch cost more than a scenario's run. Each scenario adds its own nodes and
removes them when it ends, so it sees a cluster of the head and its nodes only, and the actors it
reports are the ones created during it.

SPEC is a JSON file: `head_cpus` (the head's CPUs), `out` and `scenarios`, each with `name` (its
folder under `out`), `overrides` (the run's), `ray_overrides` (added for the cluster run), `head_cpus`
(the head's CPUs the scenario may use: the others are held by a placement group), `node_cpus` (each
further node's CPUs), `remove_node_at_checkpoint` (after the checkpoint of that round, the node of a
worker is removed; null: none), `revive_timeout_s` (how long the run waits for Ray to restart a
worker; null: rayfed's), `resume_on_new_node` (a run that stopped is resumed once a node with
`resume_on_new_node` CPUs joined) and `delete` (files deleted once the config is loaded: a plugin the
actors must get without its file). With `own_disks`, the scenario's further nodes share no file system
with the driver: the run directory (`ray` in the scenario's folder) is not there for their processes, and
each has its own `states` folder (tests/node_disk/sitecustomize.py). Writes `local.pt` and `ray.pt`
(params, buffers, history), `cluster.json` and `stderr.txt` into the scenario's folder, or `error.txt`
(the traceback) if it failed."""
import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

import ray
import torch
from ray._private import state as ray_state
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group

import rayfed
import rayfed.engine.ray

# Each node's object store: more than the test's data, and small, for a machine that runs several nodes.
OBJECT_STORE_BYTES = 100 * 2**20
# The head's own resource, through which a placement group holds the head's CPUs a scenario may not use.
HEAD = "head"
# A sitecustomize that gives a node's processes a file system of their own (own_disk).
NODE_DISK = Path(__file__).parent / "node_disk"


def worker_actors(created_after: set[str] = frozenset()) -> list[dict]:
    """Every RayClientWorker the cluster knows but those in `created_after`, dead ones included: node,
    state and restarts."""
    return [{"id": actor["ActorID"], "node": actor["Address"]["NodeID"], "state": actor["State"],
             "restarts": int(actor.get("NumRestarts", 0))}
            for actor in ray_state.actors().values()
            if actor["ActorClassName"] == "RayClientWorker" and actor["ActorID"] not in created_after]


class RemoveNode(rayfed.Callback):
    """After the checkpoint of round `round`, the node of one of the run's workers leaves the cluster,
    with its processes and its object store."""

    def __init__(self, cluster: Cluster, round: int, earlier: set[str]):
        self.cluster, self.round, self.earlier = cluster, round, earlier
        self.removed: str | None = None
        # The node of each live worker just before the removal: where the run placed them.
        self.placed: list[str] = []

    def on_checkpoint(self, run, rounds_completed):
        if rounds_completed != self.round or self.removed is not None:
            return
        self.placed = [actor["node"] for actor in worker_actors(self.earlier) if actor["state"] == "ALIVE"]
        node = next(node for node in self.cluster.worker_nodes if node.node_id in self.placed)
        self.removed = node.node_id
        self.cluster.remove_node(node)


class Tee(io.TextIOBase):
    """The scenario's stderr, kept apart, and also on the process's."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def save(result, path: Path) -> None:
    torch.save({"params": result.params, "buffers": result.buffers, "history": result.history}, path)


def run_scenario(cluster: Cluster, head_cpus: int, scenario: dict, out: Path, local_runs: dict) -> None:
    local_key = json.dumps(scenario["overrides"])
    if local_key not in local_runs:
        local = rayfed.load_config(None, scenario["overrides"] + ["engine.backend=local"])
        for path in scenario.get("delete", []):
            os.remove(path)
        local_runs[local_key] = rayfed.run(local, run_dir=out / "local", progress=False)
    save(local_runs[local_key], out / "local.pt")
    earlier = {actor["ActorID"] for actor in ray_state.actors().values()}
    held = head_cpus - scenario["head_cpus"]
    hold = placement_group([{"CPU": held, HEAD: 1}]) if held else None
    revive_timeout_s = rayfed.engine.ray.REVIVE_TIMEOUT_S
    added = []
    try:
        if hold is not None:
            ray.get(hold.ready(), timeout=60)
        for index, cpus in enumerate(scenario["node_cpus"]):
            # Started together, registered below: the nodes come up in parallel.
            added.append(cluster.add_node(wait=False, num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES,
                                          resources={f"node{index + 1}": 1},
                                          env_vars=own_disk(out, index + 1) if scenario.get("own_disks") else None))
        cluster.wait_for_nodes()
        nodes = [cluster.head_node.node_id, *(node.node_id for node in added)]
        remove = scenario.get("remove_node_at_checkpoint")
        callbacks = [RemoveNode(cluster, remove, earlier)] if remove is not None else []
        if scenario.get("revive_timeout_s") is not None:
            rayfed.engine.ray.REVIVE_TIMEOUT_S = scenario["revive_timeout_s"]
        config = rayfed.load_config(None, scenario["overrides"] + scenario["ray_overrides"] + ["engine.backend=ray"])
        stopped, before_resume = None, []
        try:
            result = rayfed.run(config, run_dir=out / "ray", progress=False, callbacks=callbacks)
        except rayfed.RunStopped as error:
            if scenario.get("resume_on_new_node") is None:
                raise
            stopped = str(error)
            before_resume = [worker["id"] for worker in worker_actors(earlier)]
            node = cluster.add_node(num_cpus=scenario["resume_on_new_node"], object_store_memory=OBJECT_STORE_BYTES)
            added.append(node)
            cluster.wait_for_nodes()
            nodes.append(node.node_id)
            result = rayfed.resume(out / "ray", progress=False)
        save(result, out / "ray.pt")
        servers = [actor["Address"]["NodeID"] for actor in ray_state.actors().values()
                   if actor["ActorClassName"] == "RayServer" and actor["ActorID"] not in earlier]
        (out / "cluster.json").write_text(json.dumps({
            "nodes": nodes, "workers": worker_actors(earlier), "before_resume": before_resume, "servers": servers,
            "removed": callbacks[0].removed if callbacks else None,
            "placed": callbacks[0].placed if callbacks else None, "stopped": stopped}))
    finally:
        rayfed.engine.ray.REVIVE_TIMEOUT_S = revive_timeout_s
        for node in added:
            if node in cluster.worker_nodes:
                cluster.remove_node(node)
        if hold is not None:
            remove_placement_group(hold)


def own_disk(out: Path, index: int) -> dict[str, str]:
    """The environment of a node whose processes see no run directory and their own `states` folder."""
    return {"PYTHONPATH": os.pathsep.join([str(NODE_DISK), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "RAYFED_TEST_NO_DIR": str(out / "ray"),
            "RAYFED_TEST_OWN_DIR": f"{out / 'states'}={out / f'states-node{index}'}"}


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": spec["head_cpus"], "resources": {HEAD: 1}, "object_store_memory": OBJECT_STORE_BYTES,
        "include_dashboard": False})
    local_runs = {}
    try:
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        for scenario in spec["scenarios"]:
            out = Path(spec["out"]) / scenario["name"]
            out.mkdir(parents=True)
            stderr = io.StringIO()
            try:
                with contextlib.redirect_stderr(Tee(sys.stderr, stderr)):
                    run_scenario(cluster, spec["head_cpus"], scenario, out, local_runs)
            except Exception:
                (out / "error.txt").write_text(traceback.format_exc())
            (out / "stderr.txt").write_text(stderr.getvalue())
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
