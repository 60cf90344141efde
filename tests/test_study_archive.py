"""experiments/gradma/mnist5k/archive.py: a trial saved from a sweep directory and restored into another is the
run's summary.json and config.yaml byte for byte and its four metrics columns value for value, and `rayfed sweep`
counts it as ended there."""
import json
from pathlib import Path

import pytest

import rayfed
from rayfed.sweep.cli import _done

from tests.scripts import load_script

SCRIPT = Path(__file__).parents[1] / "experiments" / "gradma" / "mnist5k" / "archive.py"
SWEEP = "feddyn_omega0.01"


@pytest.fixture(scope="module")
def archive():
    module = load_script(SCRIPT, "study_archive")
    module.OVERRIDES = ["train.rounds=2"]
    return module


def test_a_saved_trial_restores_as_its_run_wrote_it_and_counts_as_ended(archive, tmp_path):
    sweep = archive.sweep_of(SWEEP)
    trial = sweep.trials[0]
    run_dir = tmp_path / "sweeps" / SWEEP / "trials" / trial.name
    rayfed.run(trial.config, run_dir=run_dir, progress=False)
    assert archive.save(tmp_path / "sweeps", tmp_path / "archive") == 1
    assert archive.save(tmp_path / "sweeps", tmp_path / "archive") == 0     # kept once

    assert archive.restore(tmp_path / "archive", tmp_path / "restored") == 1
    restored = tmp_path / "restored" / SWEEP / "trials" / trial.name
    for name in ("summary.json", "config.yaml"):
        assert (restored / name).read_bytes() == (run_dir / name).read_bytes()
    written = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kept = [json.loads(line) for line in (restored / "metrics.jsonl").read_text().splitlines()]
    assert kept == [{key: row[key] for key in archive.COLUMNS} for row in written] and len(kept) == 2
    assert _done(tmp_path / "restored" / SWEEP, sweep) == {trial.name}
    assert archive.restore(tmp_path / "archive", tmp_path / "restored") == 0     # an ended trial stays


def test_a_trial_saved_with_another_result_or_restored_over_another_sweep_is_refused(archive, tmp_path):
    sweep = archive.sweep_of(SWEEP)
    trial = sweep.trials[0]
    run_dir = tmp_path / "sweeps" / SWEEP / "trials" / trial.name
    rayfed.run(trial.config, run_dir=run_dir, progress=False)
    archive.save(tmp_path / "sweeps", tmp_path / "archive")
    saved = tmp_path / "archive" / SWEEP / f"{trial.name}.json"
    saved.write_text(saved.read_text().replace('"status":"finished"', '"status":"diverged"'))
    with pytest.raises(SystemExit, match=f"{saved} holds another result for this trial than {run_dir}"):
        archive.save(tmp_path / "sweeps", tmp_path / "archive")

    other = tmp_path / "restored" / SWEEP
    other.mkdir(parents=True)
    (other / "sweep.yaml").write_text("another sweep\n")
    with pytest.raises(SystemExit, match=f"{other} holds another sweep than {SWEEP} with train.rounds=2"):
        archive.restore(tmp_path / "archive", tmp_path / "restored")
