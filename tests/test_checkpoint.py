"""Checkpoint and resume: an interrupted run continued from its last checkpoint ends bit for bit
where an uninterrupted run ends, whatever its algorithm state, client states or clients in flight."""
import json

import pytest

import rayfed
from rayfed.cli import main
from rayfed.metrics import MetricsLog
from tests.test_engine_equivalence import SYNTHETIC_MLP, assert_same_run

ROUNDS = ["train.rounds=7", "train.eval_every=2", "train.checkpoint_every=2"]


def interrupted(tmp_path, overrides, monkeypatch, fail_at_round=5):
    """Runs until the driver fails while recording round `fail_at_round` (after the checkpoint of round 4)."""
    append = MetricsLog.append

    def failing(self, metrics):
        if metrics["round"] == fail_at_round:
            raise KeyboardInterrupt
        append(self, metrics)

    monkeypatch.setattr(MetricsLog, "append", failing)
    with pytest.raises(KeyboardInterrupt):
        rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "interrupted", progress=False)
    monkeypatch.setattr(MetricsLog, "append", append)
    return tmp_path / "interrupted"


@pytest.mark.parametrize("workload", [
    ["engine.backend=local", "algorithm.name=fedavgm"],
    ["engine.backend=local", "algorithm.name=gradma", "algorithm.memory_size=10"],
    ["engine.backend=local", "algorithm.name=fedavg", "train.round_policy=async_buffered", "train.buffer_size=4",
     "train.concurrency=9", "systems.step_time_spread=1.0", "train.staleness_weight=sqrt"],
])
def test_resume_after_interruption_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch, workload):
    overrides = SYNTHETIC_MLP + ROUNDS + workload
    whole = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "whole", progress=False)
    run_dir = interrupted(tmp_path, overrides, monkeypatch)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
    assert not (run_dir / "checkpoint.pt.tmp").exists()
    resumed = rayfed.resume(run_dir, progress=False)
    assert_same_run(whole, resumed)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == list(range(1, 8))
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 7


def test_resume_on_the_ray_engine_restores_client_states_to_their_workers(tmp_path, monkeypatch, ray_cluster):
    overrides = SYNTHETIC_MLP + ROUNDS + ["engine.backend=ray", "engine.num_workers=2", "algorithm.name=mifa"]
    whole = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "whole", progress=False)
    resumed = rayfed.resume(interrupted(tmp_path, overrides, monkeypatch), progress=False)
    assert_same_run(whole, resumed)
    assert resumed.summary["client_state_bytes"] == whole.summary["client_state_bytes"] > 0


def test_resume_errors(tmp_path, capsys, monkeypatch):
    done = tmp_path / "done"
    rayfed.run(rayfed.load_config(None, SYNTHETIC_MLP + ["engine.backend=local", "train.rounds=2"]),
               run_dir=done, progress=False)
    assert main(["run", "--resume", str(done)]) == 2
    assert "has no checkpoint.pt to resume from" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert main(["run", "--resume", str(done), "seed=3"]) == 2
    assert "--resume takes the run directory alone" in capsys.readouterr().err
    (done / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert main(["run", "--resume", str(done)]) == 2
    assert "cannot read" in capsys.readouterr().err
