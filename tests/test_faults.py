"""Real faults on the ray engine: worker and server processes that exit at chosen moments, workers
slower than engine.round_timeout_s. The run completes (or stops with one line when an actor is out
of restarts), the round's metrics say what was lost, and no client state moves on without the server."""
import json
import subprocess
import sys

import pytest
import ray
import torch

import rayfed
from rayfed.checkpoint import read_checkpoint
from rayfed.cli import main
from rayfed.errors import ConfigError
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run

pytestmark = pytest.mark.slow

RAY_MIFA = SYNTHETIC_MLP + [*ON_RAY, "engine.num_workers=2", "algorithm.name=mifa", "train.rounds=6",
                            "train.eval_every=3"]


def run(tmp_path, *overrides, base=RAY_MIFA, name="run"):
    return rayfed.run(rayfed.load_config(None, base + list(overrides)), run_dir=tmp_path / name, progress=False)


def assert_mifa_invariant(run_dir, num_clients=30):
    """The server's average of latest updates is the mean of the clients' committed latest updates."""
    checkpoint = read_checkpoint(run_dir)
    latest = [state.latest_model_change for state in checkpoint.client_states.values()]
    expected = torch.stack(latest).sum(0) / num_clients
    assert torch.allclose(checkpoint.server["state"].average, expected, atol=1e-6)


def test_a_worker_killed_while_training_is_restarted_with_its_clients_states_from_the_checkpoint(tmp_path,
                                                                                                ray_cluster):
    history = run(tmp_path, "engine.fault_injection=['kill:1:3']", "train.checkpoint_every=2").history
    assert len(history) == 6
    killed = history[2]
    assert killed["failed_workers"] == {"1": "died"}
    assert killed["num_lost"] > 0 and killed["num_participants"] == 7 - killed["num_lost"]
    assert killed["client_states_after_restart"] == "restored from the checkpoint of round 2"
    assert all("failed_workers" not in m and m["num_participants"] == 7 for m in history[3:])


def test_worker_deaths_between_rounds_and_during_checkpoints_never_end_the_run(tmp_path, ray_cluster):
    """Killed while idle (its next round fails), after delivering a round but before that round's
    checkpoint (the checkpoint is still written), and while handing over its states for a checkpoint."""
    result = run(tmp_path, "train.rounds=7", "train.checkpoint_every=2",
                 "engine.fault_injection=['kill:0:1:idle', 'kill:1:2:delivered', 'kill:0:4:checkpoint']")
    history = result.history
    assert [m["round"] for m in history] == list(range(1, 8))
    assert history[1]["failed_workers"] == {"0": "died"}          # died idle after round 1
    assert history[1]["client_states_after_restart"] == "reset: no checkpoint"
    # worker 1 died after delivering round 2, found at the round-2 checkpoint; round 2's uploads counted
    assert history[1]["num_participants"] == 7 - history[1]["num_lost"]
    assert history[2]["client_states_after_restart"] == "reset: no checkpoint"
    assert history[4]["client_states_after_restart"] == "restored from the checkpoint of round 2"
    assert read_checkpoint(result.run_dir).rounds_completed == 6
    assert result.summary["status"] == "finished"


def test_a_worker_killed_again_while_restarting_comes_back(tmp_path, ray_cluster):
    history = run(tmp_path, "engine.fault_injection=['kill:1:2:restart']").history
    assert len(history) == 6
    assert history[1]["failed_workers"] == {"1": "died"}
    assert all(m["num_participants"] == 7 for m in history[2:])


def test_a_worker_out_of_restarts_stops_the_run_with_a_checkpoint_and_one_line(tmp_path, ray_cluster):
    """The stop's line is all the command prints: Ray prints no "Unhandled error" of its own for the calls that the
    dead worker failed (the run reads each). A command of its own, whose stderr Ray's log lines reach, on this Ray."""
    out = tmp_path / "run"
    rayfed.release_actors()     # the CPUs they hold, for the command's workers
    completed = subprocess.run([sys.executable, "-m", "rayfed", "run", *RAY_MIFA, "engine.worker_max_restarts=1",
                                "train.checkpoint_every=5", "engine.fault_injection=['kill:1:2:restart']",
                                f"engine.address={ray.get_runtime_context().gcs_address}", "--out", str(out),
                                "--quiet"], capture_output=True, text=True, timeout=600)
    err = completed.stderr
    assert completed.returncode == 1
    assert "Unhandled error" not in err
    assert err.count("\n") == 1 and err.startswith("rayfed: stopped: worker 1 died more than "
                                                   "engine.worker_max_restarts=1 times"), err
    assert f"rayfed run --resume {out}" in err
    assert read_checkpoint(out).rounds_completed == 2
    assert json.loads((out / "summary.json").read_text())["status"] == "workers_lost"
    resumed = rayfed.resume(out, progress=False)
    assert resumed.summary["rounds_completed"] == 6


@pytest.mark.parametrize("faults", [
    # died while stepping round 3 (from the round-2 checkpoint), again while taking the round-4 one
    "['kill_server:3', 'kill_server:4:checkpoint']",
    # a worker died training round 3 and the server stepping it: the worker is revived in the recovery
    "['kill:1:3', 'kill_server:3']",
])
def test_a_killed_server_is_recreated_and_the_run_ends_with_the_uninterrupted_bits(tmp_path, ray_cluster, faults):
    base = SYNTHETIC_MLP + ["algorithm.name=mifa", "train.rounds=6", "train.eval_every=3",
                            "train.checkpoint_every=2"]
    whole = run(tmp_path, "engine.backend=local", base=base, name="whole")
    recovered = run(tmp_path, *ON_RAY, "engine.num_workers=2", f"engine.fault_injection={faults}",
                    base=base)
    assert_same_run(whole, recovered)
    assert recovered.summary["server_restarts"] == faults.count("kill_server")
    lines = (recovered.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == list(range(1, 7))


@pytest.mark.parametrize("fault, origin", [
    ("kill:0:1:idle", "the start"),                             # found in round 2, before any checkpoint
    ("kill:1:4:checkpoint", "the checkpoint of round 2"),       # handing over its states for the round-4 checkpoint
])
def test_with_worker_loss_replay_a_dead_worker_takes_the_run_back_to_the_uninterrupted_bits(tmp_path, capsys,
                                                                                           ray_cluster, fault, origin):
    base = SYNTHETIC_MLP + ["algorithm.name=mifa", "train.rounds=6", "train.eval_every=3", "train.checkpoint_every=2"]
    whole = run(tmp_path, "engine.backend=local", base=base, name="whole")
    replayed = run(tmp_path, *ON_RAY, "engine.num_workers=2", "engine.worker_loss=replay",
                   f"engine.fault_injection=['{fault}']", base=base)
    assert_same_run(whole, replayed)
    worker, round = fault.split(":")[1], int(fault.split(":")[2]) + fault.endswith("idle")
    assert (f"rayfed: worker {worker} died in round {round}; went back to {origin} and running the rounds since again "
            f"(engine.worker_loss=replay)\n") in capsys.readouterr().err
    assert replayed.summary["server_restarts"] == 0
    assert_mifa_invariant(replayed.run_dir)


def test_a_server_killed_without_a_checkpoint_starts_over(tmp_path, ray_cluster):
    base = SYNTHETIC_MLP + ["train.rounds=4"]
    whole = run(tmp_path, "engine.backend=local", base=base, name="whole")
    recovered = run(tmp_path, *ON_RAY, "engine.fault_injection=['kill_server:3']", base=base)
    assert_same_run(whole, recovered)


def test_a_server_out_of_restarts_stops_the_run(tmp_path, capsys, ray_cluster):
    out = tmp_path / "run"
    code = main(["run", *RAY_MIFA, "engine.server_max_restarts=0", "engine.fault_injection=['kill_server:2']",
                 "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "the server actor died in round 2, more than engine.server_max_restarts=0 times" in err
    assert json.loads((out / "summary.json").read_text())["status"] == "server_lost"


def test_a_worker_out_of_restarts_while_the_server_is_recreated_stops_without_a_false_checkpoint(tmp_path, capsys,
                                                                                               ray_cluster):
    out = tmp_path / "run"
    code = main(["run", *RAY_MIFA, "engine.worker_max_restarts=1",
                 "engine.fault_injection=['kill:1:3:restart', 'kill_server:3']", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert err[-1] == ("rayfed: stopped: worker 1 died more than engine.worker_max_restarts=1 times while the server "
                       "was being recreated; there is no checkpoint to resume from"), err
    assert not (out / "checkpoint.pt").exists()
    assert json.loads((out / "summary.json").read_text())["status"] == "workers_lost"


def test_a_late_worker_is_a_straggler_and_its_clients_do_not_move_on(tmp_path, ray_cluster):
    result = run(tmp_path, "engine.fault_injection=['delay:0:3:6']", "engine.round_timeout_s=3",
                 "train.checkpoint_every=5")
    history = result.history
    assert history[2]["failed_workers"] == {"0": "late"}
    assert history[2]["num_lost"] > 0
    assert len(history) == 6 and "failed_workers" not in history[-1]
    assert_mifa_invariant(result.run_dir)


@pytest.mark.parametrize("overrides, message", [
    (["engine.fault_injection=['kill:5:1']"], "must be kill:WORKER:ROUND[:WHEN]"),
    (["engine.fault_injection=['delay:0:1']"], "must be kill:WORKER:ROUND[:WHEN]"),
    (["engine.fault_injection=['kill:0:1:lunch']"], "must be kill:WORKER:ROUND[:WHEN]"),
    (["engine.fault_injection=['kill_server:0']"], "must be kill:WORKER:ROUND[:WHEN]"),
    (["engine.round_timeout_s=0"], "engine.round_timeout_s"),
    (["engine.backend=local", "engine.round_timeout_s=2"], "need engine.backend=ray"),
    (["engine.backend=local", "engine.worker_loss=replay"], "^engine.worker_loss=replay needs engine.backend=ray: the "
                                                            "local engine has no actors to place or lose$"),
    (["engine.backend=local", "engine.placement=spread", "engine.worker_loss=replay"],
     "^engine.placement=spread and engine.worker_loss=replay need engine.backend=ray"),
])
def test_fault_configuration_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        rayfed.load_config(None, RAY_MIFA + overrides)


def test_a_worker_killed_before_its_clients_track_the_round_is_restarted_from_the_checkpoint(tmp_path, ray_cluster):
    """FedGATE's clients finish a round with the server's reply: a worker that dies after delivering
    (before the reply) is revived, its clients' tracking vectors back to the checkpoint's."""
    result = run(tmp_path, "algorithm.name=fedgate", "train.rounds=5", "train.checkpoint_every=2",
                 "engine.fault_injection=['kill:1:3:delivered']")
    history = result.history
    assert [m["round"] for m in history] == [1, 2, 3, 4, 5]
    assert history[2]["failed_workers"] == {"1": "died"}
    assert any(m.get("client_states_after_restart") == "restored from the checkpoint of round 2" for m in history)
    assert result.summary["status"] == "finished" and result.summary["client_state_bytes"] > 0
