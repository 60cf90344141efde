"""A run on a Ray cluster of several nodes on this machine (ray.cluster_utils.Cluster: one raylet and
object store per node), beside the same run on the local engine: `python -m tests.multinode_run SPEC`.

A process of its own, since a process holds one Ray connection and the tests' session already holds
one. SPEC is a JSON file: `overrides` (the run's), `ray_overrides` (added for the cluster run),
`head_cpus` and `node_cpus` (the head's and each further node's CPUs), `remove_node_at_checkpoint`
(after the checkpoint of that round, the node of a worker is removed; null: none), `revive_timeout_s`
(how long the run waits for Ray to restart a worker; null: rayfed's), `resume_on_new_node` (a run
that stopped is resumed once a node with `resume_on_new_node` CPUs joined), `delete` (files deleted
once the config is loaded: a plugin the actors must get without its file) and `out`. Writes
`local.pt` and `ray.pt` (params, buffers, history) and `cluster.json` into `out`."""
import json
import os
import sys
from pathlib import Path

import ray
import torch
from ray._private import state as ray_state
from ray.cluster_utils import Cluster

import rayfed
import rayfed.engine.ray

# Each node's object store: more than the test's data, and small, for a machine that runs several nodes.
OBJECT_STORE_BYTES = 100 * 2**20


def worker_actors() -> list[dict]:
    """Every RayClientWorker the cluster knows, dead ones included: node, state and restarts."""
    return [{"id": actor["ActorID"], "node": actor["Address"]["NodeID"], "state": actor["State"],
             "restarts": int(actor.get("NumRestarts", 0))}
            for actor in ray_state.actors().values() if actor["ActorClassName"] == "RayClientWorker"]


class RemoveNode(rayfed.Callback):
    """After the checkpoint of round `round`, the node of one of the run's workers leaves the cluster,
    with its processes and its object store."""

    def __init__(self, cluster: Cluster, round: int):
        self.cluster, self.round = cluster, round
        self.removed: str | None = None

    def on_checkpoint(self, run, rounds_completed):
        if rounds_completed != self.round or self.removed is not None:
            return
        busy = {actor["node"] for actor in worker_actors() if actor["state"] == "ALIVE"}
        node = next(node for node in self.cluster.worker_nodes if node.node_id in busy)
        self.removed = node.node_id
        self.cluster.remove_node(node)


def save(result, path: Path) -> None:
    torch.save({"params": result.params, "buffers": result.buffers, "history": result.history}, path)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    local = rayfed.load_config(None, spec["overrides"] + ["engine.backend=local"])
    for path in spec.get("delete", []):
        os.remove(path)
    save(rayfed.run(local, run_dir=out / "local", progress=False), out / "local.pt")
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": spec["head_cpus"], "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False})
    try:
        for index, cpus in enumerate(spec["node_cpus"]):
            # Started together, registered below: the nodes come up in parallel.
            cluster.add_node(wait=False, num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES,
                             resources={f"node{index + 1}": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        nodes = [cluster.head_node.node_id, *(node.node_id for node in cluster.worker_nodes)]
        remove = spec.get("remove_node_at_checkpoint")
        callbacks = [RemoveNode(cluster, remove)] if remove is not None else []
        if spec.get("revive_timeout_s") is not None:
            rayfed.engine.ray.REVIVE_TIMEOUT_S = spec["revive_timeout_s"]
        config = rayfed.load_config(None, spec["overrides"] + spec["ray_overrides"] + ["engine.backend=ray"])
        stopped, before_resume = None, []
        try:
            result = rayfed.run(config, run_dir=out / "ray", progress=False, callbacks=callbacks)
        except rayfed.RunStopped as error:
            if spec.get("resume_on_new_node") is None:
                raise
            stopped = str(error)
            before_resume = [worker["id"] for worker in worker_actors()]
            node = cluster.add_node(num_cpus=spec["resume_on_new_node"], object_store_memory=OBJECT_STORE_BYTES)
            cluster.wait_for_nodes()
            nodes.append(node.node_id)
            result = rayfed.resume(out / "ray", progress=False)
        save(result, out / "ray.pt")
        servers = [actor["Address"]["NodeID"] for actor in ray_state.actors().values()
                   if actor["ActorClassName"] == "RayServer"]
        (out / "cluster.json").write_text(json.dumps({
            "nodes": nodes, "workers": worker_actors(), "before_resume": before_resume, "servers": servers,
            "removed": callbacks[0].removed if callbacks else None, "stopped": stopped}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
