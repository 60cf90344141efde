"""engine.reuse_actors: a run builds the actors the previous run in its process kept, with its own config and
plugins and the bits of fresh ones; actors that died, of other options, or released, end."""
import os
import signal
import textwrap
import time

import pytest
from ray._private import state as ray_state

import rayfed
from rayfed.callbacks.dispatch import CallbackFailed
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run, run
from tests.test_plugins import forget_plugins

pytestmark = pytest.mark.slow

MIFA = [*SYNTHETIC_MLP, "algorithm.name=mifa", "train.rounds=3"]


def alive(*actor_classes, count=None):
    """Ids of the live actors of `actor_classes` (RayClientWorker, RayServer) on the cluster, once those killed
    have ended: ray.kill returns before Ray ends the actor, which then still shows as alive for a moment. With
    `count`, the number of live actors the caller expects: waited for, up to 30 s, before the ids are read."""
    deadline = time.monotonic() + 30
    while True:
        entries = [entry for entry in ray_state.actors().values() if entry["ActorClassName"] in actor_classes]
        settled = all(entry["State"] in ("ALIVE", "DEAD") for entry in entries)
        live = {entry["ActorID"] for entry in entries if entry["State"] == "ALIVE"}
        if time.monotonic() > deadline or (settled and (count is None or len(live) == count)):
            return live
        time.sleep(0.1)


def ever(actor_class):
    return {actor_id for actor_id, entry in ray_state.actors().items() if entry["ActorClassName"] == actor_class}


@pytest.fixture
def no_kept_actors(ray_cluster):
    rayfed.release_actors()
    yield
    rayfed.release_actors()


def test_the_next_run_builds_the_kept_actors_for_its_own_config_with_the_local_bits(tmp_path, no_kept_actors):
    run(tmp_path, [*SYNTHETIC_MLP, *ON_RAY, "engine.num_workers=2"], "first")
    workers, servers = alive("RayClientWorker", count=2), alive("RayServer", count=1)
    assert len(workers) == 2 and len(servers) == 1
    created = ever("RayClientWorker") | ever("RayServer")
    # Another algorithm (client states, a server that holds every client's update) on the same actors.
    second = run(tmp_path, [*MIFA, *ON_RAY, "engine.num_workers=2"], "second")
    assert ever("RayClientWorker") | ever("RayServer") == created
    assert alive("RayClientWorker", count=2) == workers and alive("RayServer", count=1) == servers
    assert_same_run(run(tmp_path, [*MIFA, "engine.backend=local"], "local"), second)


def test_a_kept_actor_takes_the_plugins_of_the_run_that_reuses_it(tmp_path, no_kept_actors):
    """Two plugin files register one model name with different activations: the second run's reused workers
    train the second's, as the local engine does."""
    activations = {"first": "ReLU", "second": "Tanh"}
    for name, activation in activations.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""\
            import math
            from torch import nn
            import rayfed

            @rayfed.register_model("pooled_mlp")
            def pooled_mlp(input_shape, num_classes):
                return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 8), nn.{activation}(),
                                     nn.Linear(8, num_classes))
            """))
    results = {}
    try:
        for name in activations:
            overrides = [*SYNTHETIC_MLP, f"plugins=[{tmp_path / name}.py]", "model.name=pooled_mlp"]
            results[name] = run(tmp_path, [*overrides, *ON_RAY, "engine.num_workers=2"], f"{name}_ray")
            assert_same_run(run(tmp_path, [*overrides, "engine.backend=local"], f"{name}_local"), results[name])
            forget_plugins()
    finally:
        forget_plugins()
    assert not (results["first"].params == results["second"].params).all()


def test_actors_another_run_does_not_take_end(tmp_path, no_kept_actors):
    run(tmp_path, [*SYNTHETIC_MLP, *ON_RAY, "engine.num_workers=1"], "kept")
    first = alive("RayClientWorker", "RayServer", count=2)
    assert len(first) == 2
    # Other options: the kept worker ends, the server is built again.
    run(tmp_path, [*SYNTHETIC_MLP, *ON_RAY, "engine.num_workers=1", "engine.worker_cpus=0.5"], "other_cpus")
    second = alive("RayClientWorker", "RayServer", count=2)
    assert len(second & first) == 1 and len(second) == 2
    # Without engine.reuse_actors a run takes none, and keeps none.
    one_worker = [*SYNTHETIC_MLP, "engine.num_workers=1", "engine.server=driver"]
    run(tmp_path, [*one_worker, "engine.backend=ray"], "not_reusing")
    assert not alive("RayClientWorker", "RayServer", count=0)
    run(tmp_path, [*one_worker, *ON_RAY], "released")
    assert len(alive("RayClientWorker", count=1)) == 1
    rayfed.release_actors()
    assert not alive("RayClientWorker", count=0)


def test_a_worker_that_died_is_not_kept(tmp_path, no_kept_actors):
    run(tmp_path, [*MIFA, *ON_RAY, "engine.num_workers=1", "engine.server=driver",
                   "engine.fault_injection=['kill:0:2']"], "killed")
    assert not alive("RayClientWorker", count=0)


class Fails(rayfed.Callback):
    def on_round_end(self, run, record):
        raise RuntimeError("a failing callback")


def test_a_run_that_fails_keeps_no_actors(tmp_path, no_kept_actors):
    """Its actors may be busy or broken: the next run starts its own."""
    config = rayfed.load_config(None, [*SYNTHETIC_MLP, *ON_RAY, "engine.num_workers=1", "engine.server=driver"])
    with pytest.raises(CallbackFailed, match="RuntimeError: a failing callback"):
        rayfed.run(config, run_dir=tmp_path / "failed", progress=False, callbacks=[Fails()])
    assert not alive("RayClientWorker", count=0)


def test_a_kept_worker_that_died_while_it_waited_ends_and_is_replaced(tmp_path, no_kept_actors):
    one_worker = [*SYNTHETIC_MLP, *ON_RAY, "engine.num_workers=1", "engine.server=driver"]
    run(tmp_path, one_worker, "kept")
    (kept,) = alive("RayClientWorker")
    os.kill(ray_state.actors()[kept]["Pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while ray_state.actors()[kept]["NumRestarts"] == 0 or kept not in alive("RayClientWorker"):
        assert time.monotonic() < deadline, "Ray did not restart the killed worker"
        time.sleep(0.2)
    second = run(tmp_path, one_worker, "after")
    (replacement,) = alive("RayClientWorker")
    assert replacement != kept
    assert_same_run(run(tmp_path, [*SYNTHETIC_MLP, "engine.backend=local"], "local"), second)
