"""Real faults on the ray engine: a worker killed mid-run, a worker slower than engine.round_timeout_s.
The run completes, the round's metrics say what was lost, and no client state moves on without the server."""
import pytest
import torch

import rayfed
from rayfed.checkpoint import load_checkpoint
from rayfed.errors import ConfigError
from tests.test_engine_equivalence import SYNTHETIC_MLP

RAY_MIFA = SYNTHETIC_MLP + ["engine.backend=ray", "engine.num_workers=2", "algorithm.name=mifa", "train.rounds=6",
                            "train.eval_every=3"]


def run(tmp_path, *overrides):
    return rayfed.run(rayfed.load_config(None, RAY_MIFA + list(overrides)), run_dir=tmp_path / "run", progress=False)


def assert_mifa_invariant(run_dir, num_clients=30):
    """The server's average of latest updates is the mean of the clients' committed latest updates."""
    checkpoint = load_checkpoint(run_dir)
    latest = [state.latest_update for state in checkpoint["client_states"].values()]
    expected = torch.stack(latest).sum(0) / num_clients
    assert torch.allclose(checkpoint["server"]["state"].average, expected, atol=1e-6)


def test_a_killed_worker_is_restarted_with_its_clients_states_from_the_checkpoint(tmp_path, ray_cluster):
    result = run(tmp_path, "engine.fault_injection=['kill:1:3']", "train.checkpoint_every=2")
    history = result.history
    assert len(history) == 6
    killed = history[2]
    assert killed["failed_workers"] == {"1": "died"}
    assert killed["num_lost"] > 0 and killed["num_participants"] == 7 - killed["num_lost"]
    assert killed["client_states_after_restart"] == "restored from the checkpoint of round 2"
    assert all("failed_workers" not in m and m["num_participants"] == 7 for m in history[3:])


def test_without_a_checkpoint_the_restarted_workers_clients_start_over(tmp_path, ray_cluster):
    history = run(tmp_path, "engine.fault_injection=['kill:0:2']").history
    assert history[1]["failed_workers"] == {"0": "died"}
    assert history[1]["client_states_after_restart"] == "reset: no checkpoint"
    assert len(history) == 6 and history[-1]["num_participants"] == 7


def test_a_late_worker_is_a_straggler_and_its_clients_do_not_move_on(tmp_path, ray_cluster):
    result = run(tmp_path, "engine.fault_injection=['delay:0:3:6']", "engine.round_timeout_s=3",
                 "train.checkpoint_every=5")
    history = result.history
    assert history[2]["failed_workers"] == {"0": "late"}
    assert history[2]["num_lost"] > 0
    assert len(history) == 6 and "failed_workers" not in history[-1]
    assert_mifa_invariant(result.run_dir)


@pytest.mark.parametrize("overrides, message", [
    (["engine.fault_injection=['kill:5:1']"], "must be kill:WORKER:ROUND or delay:WORKER:ROUND:SECONDS"),
    (["engine.fault_injection=['delay:0:1']"], "must be kill:WORKER:ROUND or delay:WORKER:ROUND:SECONDS"),
    (["engine.round_timeout_s=0"], "engine.round_timeout_s=0.0 must be > 0"),
    (["engine.backend=local", "engine.round_timeout_s=2"], "need engine.backend=ray"),
])
def test_fault_configuration_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        rayfed.load_config(None, RAY_MIFA + overrides)
