"""The ray engine on several nodes: a ray.cluster_utils.Cluster on this machine, each node a raylet
with its own object store. Workers spread over the nodes, the data and a file plugin reach every
node, the run has the local engine's bits, and a node removed mid-run is survived.

The clusters run in a process of their own (tests/multinode_run.py): a process holds one Ray
connection, and the session's `ray_cluster` holds this one's. The tests' runs share that process and
its head node; each adds and removes its own nodes."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rayfed.checkpoint import read_checkpoint
from tests.test_engine_equivalence import SYNTHETIC_MLP, without_wall_clock
from tests.test_faults import assert_mifa_invariant
from tests.test_plugins import EXAMPLE, RUN as PLUGIN_RUN

# One worker runs the module: its tests share one cluster run (cluster_runs).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("multinode")]

REPOSITORY = Path(__file__).parents[1]
MIFA = SYNTHETIC_MLP + ["algorithm.name=mifa", "train.rounds=5", "train.checkpoint_every=2"]
# The head's CPUs; a scenario given fewer finds the others held.
HEAD_CPUS = 2
SPILLED = "test_spilled_states_are_restored_on_another_node_without_a_shared_file_system"


def scenarios(folder):
    """Each test's cluster run, by the test's name: its overrides and its cluster (see tests/multinode_run.py)."""
    plugin = folder / "my_plugins.py"
    return {
        "test_three_nodes_run_a_file_plugin_that_exists_only_where_the_driver_loaded_it": dict(
            overrides=[f"plugins=[{plugin}]" if entry.startswith("plugins=") else entry for entry in PLUGIN_RUN],
            ray_overrides=["engine.num_workers=3", "engine.placement=spread"], head_cpus=1, node_cpus=[1, 1],
            delete=[str(plugin)]),
        "test_a_node_removed_with_no_room_left_stops_with_one_line_and_resumes_to_the_uninterrupted_bits": dict(
            overrides=MIFA, ray_overrides=["engine.num_workers=2", "engine.placement=spread",
                                           "engine.worker_loss=replay"],
            head_cpus=1, node_cpus=[1], remove_node_at_checkpoint=2, revive_timeout_s=3, resume_on_new_node=1),
        "test_a_node_removed_mid_run_loses_its_workers_clients_for_one_round_and_goes_on": dict(
            overrides=MIFA, ray_overrides=["engine.num_workers=2", "engine.placement=spread"],
            head_cpus=2, node_cpus=[1], remove_node_at_checkpoint=2),
        "test_spilled_states_are_restored_on_another_node_without_a_shared_file_system": dict(
            overrides=MIFA + ["engine.state_memory_mb=0", f"engine.state_dir={folder / SPILLED / 'states'}"],
            ray_overrides=["engine.num_workers=2", "engine.placement=spread", "engine.worker_loss=replay"],
            head_cpus=0, node_cpus=[1, 1, 1], own_disks=True, remove_node_at_checkpoint=2),
        "test_a_node_removed_mid_run_is_replayed_from_the_checkpoint_to_the_uninterrupted_bits": dict(
            overrides=MIFA, ray_overrides=["engine.num_workers=2", "engine.placement=spread",
                                           "engine.worker_loss=replay"],
            head_cpus=2, node_cpus=[1], remove_node_at_checkpoint=2),
    }


@pytest.fixture(scope="module")
def cluster_runs(request, tmp_path_factory):
    """The selected tests' scenarios, run in one process on one head (tests/multinode_run.py says why)."""
    folder = tmp_path_factory.mktemp("multinode")
    shutil.copy(EXAMPLE, folder / "my_plugins.py")
    selected = {item.name for item in request.session.items if item.module is request.module}
    chosen = [{"name": name, **scenario} for name, scenario in scenarios(folder).items() if name in selected]
    spec = {"head_cpus": HEAD_CPUS, "out": str(folder), "scenarios": chosen}
    (folder / "spec.json").write_text(json.dumps(spec))
    completed = subprocess.run([sys.executable, "-m", "tests.multinode_run", str(folder / "spec.json")],
                               cwd=REPOSITORY, capture_output=True, text=True, timeout=240 * len(chosen))
    assert completed.returncode == 0, completed.stderr[-5000:]
    return folder


def run_on_cluster(cluster_runs, request):
    """The test's run on the local engine and on its cluster; returns both results, what the cluster saw
    (its nodes, where each worker and server ran), the run's stderr and the scenario's folder."""
    out = cluster_runs / request.node.name
    error = out / "error.txt"
    assert not error.exists(), error.read_text()[-5000:]
    local, ray = (torch.load(out / f"{name}.pt", weights_only=False) for name in ("local", "ray"))
    return local, ray, json.loads((out / "cluster.json").read_text()), (out / "stderr.txt").read_text(), out


def assert_same_bits(local, ray):
    assert torch.equal(local["params"], ray["params"])
    assert torch.equal(local["buffers"], ray["buffers"])
    assert without_wall_clock(local["history"]) == without_wall_clock(ray["history"])


def test_three_nodes_run_a_file_plugin_that_exists_only_where_the_driver_loaded_it(cluster_runs, request):
    """The plugin's algorithm and model train on every node; its file is deleted once the driver has
    loaded it, so the workers can only have it from the driver, by value."""
    local, ray, cluster, _, _ = run_on_cluster(cluster_runs, request)
    assert not (cluster_runs / "my_plugins.py").exists()
    assert sorted(worker["node"] for worker in cluster["workers"]) == sorted(cluster["nodes"])
    assert local["history"][-1]["test_accuracy"] > 0.5
    assert_same_bits(local, ray)


def test_a_node_removed_mid_run_is_replayed_from_the_checkpoint_to_the_uninterrupted_bits(cluster_runs, request):
    """Two nodes: until the removal, Ray's SPREAD strategy, not a full node (the head had room for both), had sent
    the second worker to the other node, which read the data from its own object store. engine.worker_loss=replay:
    the round in which the node's worker died runs again from the checkpoint of round 2, with the worker restarted
    on the head's spare CPU."""
    local, ray, cluster, stderr, _ = run_on_cluster(cluster_runs, request)
    assert sorted(cluster["placed"]) == sorted(cluster["nodes"])
    assert_node_gone_and_worker_revived(cluster)
    assert re.search(r"^rayfed: worker [01] died in round 3; went back to the checkpoint of round 2 and running the "
                     r"rounds since again \(engine.worker_loss=replay\)$", stderr, re.MULTILINE), stderr[-3000:]
    # on the driver's node, and a fresh one there from the checkpoint
    assert cluster["servers"] == [cluster["nodes"][0]] * 2
    assert_same_bits(local, ray)


def test_a_node_removed_with_no_room_left_stops_with_one_line_and_resumes_to_the_uninterrupted_bits(cluster_runs,
                                                                                                      request):
    """Two one-CPU nodes, two workers: the removed node's worker has nowhere to go. The run stops
    with one line, keeping the checkpoint of round 2; resumed once a new node joined, it ends with
    the bits of an uninterrupted run."""
    local, ray, cluster, _, out = run_on_cluster(cluster_runs, request)
    assert re.fullmatch(r"worker [01] died and Ray found no node with room to restart it within 3 s; stopped in "
                        r"round 3, the last checkpoint kept \(engine.worker_loss=replay\); resume from the last "
                        rf"checkpoint with: rayfed run --resume {out / 'ray'}", cluster["stopped"])
    head, removed, added = cluster["nodes"]
    assert removed == cluster["removed"]
    # The actor table's order is not creation order: the resumed run's workers are those created after the stop.
    resumed_workers = [worker["node"] for worker in cluster["workers"] if worker["id"] not in cluster["before_resume"]]
    assert sorted(resumed_workers) == sorted([head, added])
    assert_same_bits(local, ray)


def test_a_node_removed_mid_run_loses_its_workers_clients_for_one_round_and_goes_on(cluster_runs, request):
    """engine.worker_loss=continue (the default): as when a worker dies on one node, the round completes
    without the dead worker's clients, whose states come back from the checkpoint of round 2."""
    local, ray, cluster, _, out = run_on_cluster(cluster_runs, request)
    assert_node_gone_and_worker_revived(cluster)
    history = ray["history"]
    assert without_wall_clock(history[:2]) == without_wall_clock(local["history"][:2])
    assert list(history[2]["failed_workers"].values()) == ["died"]
    assert history[2]["num_lost"] > 0 and history[2]["num_participants"] == 7 - history[2]["num_lost"]
    assert history[2]["client_states_after_restart"] == "restored from the checkpoint of round 2"
    assert [m["round"] for m in history] == [1, 2, 3, 4, 5]
    assert all("failed_workers" not in m and m["num_participants"] == 7 for m in history[3:])
    assert cluster["servers"] == [cluster["nodes"][0]]
    assert read_checkpoint(out / "ray").rounds_completed == 4
    assert_mifa_invariant(out / "ray")


def test_spilled_states_are_restored_on_another_node_without_a_shared_file_system(cluster_runs, request):
    """MIFA's states spilled, both workers on nodes that see neither the run directory nor each other's
    engine.state_dir (tests/node_disk). The checkpoint's copies of their shards reach the run directory
    through the relay on the driver's node; the removed node's worker, restarted on the third node,
    reads its copy back the same way, and the replayed run has the uninterrupted bits."""
    local, ray, cluster, stderr, out = run_on_cluster(cluster_runs, request)
    head, *added = cluster["nodes"]
    assert cluster["removed"] in added
    assert sorted(worker["restarts"] for worker in cluster["workers"]) == [0, 1]
    assert {worker["node"] for worker in cluster["workers"]} == set(added) - {cluster["removed"]}
    assert re.search(r"^rayfed: worker [01] died in round 3; went back to the checkpoint of round 2 and running the "
                     r"rounds since again \(engine.worker_loss=replay\)$", stderr, re.MULTILINE), stderr[-3000:]
    assert_same_bits(local, ray)
    # The copies are in the run directory, where only the relay could write them.
    assert sorted(path.name for path in (out / "ray" / "checkpoint.d").glob("round-*/*.bin")) == [
        "shard-0-of-2.bin", "shard-1-of-2.bin"]
    # Each live shard was on its worker's node: the removed node keeps its worker's; the workers still
    # running removed theirs when the run ended.
    for index, node in enumerate(added, start=1):
        shards = [path.name for path in (out / f"states-node{index}").glob("*.bin")]
        assert len(shards) == (node == cluster["removed"]), (index, shards)


def assert_node_gone_and_worker_revived(cluster):
    """The removed node held one worker; Ray restarted it once, on the head's spare CPU."""
    removed = cluster["removed"]
    assert removed == cluster["nodes"][1]
    assert sorted(worker["restarts"] for worker in cluster["workers"]) == [0, 1]
    assert [worker["node"] for worker in cluster["workers"]] == [cluster["nodes"][0]] * 2
