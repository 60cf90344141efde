"""Checkpoint and resume: an interrupted run continued from its last checkpoint ends bit for bit
where an uninterrupted run ends, whatever its algorithm state, client states or clients in flight;
a run directory damaged since is refused with one line and left as it was."""
import hashlib
import io
import json
import os
import shutil

import pytest
import torch

import rayfed
from rayfed.registry import ALGORITHMS
from rayfed.checkpoint import MAGIC, read_checkpoint
from rayfed.cli import main
from rayfed.metrics import MetricsLog
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run

ROUNDS = ["train.rounds=7", "train.eval_every=2", "train.checkpoint_every=2"]
# One worker runs the module, so that its interrupted runs (resumable) are made once.
pytestmark = pytest.mark.xdist_group("checkpoint")


def interrupted(tmp_path, overrides, monkeypatch, fail_at_round=5, name="interrupted"):
    """Runs until the driver fails while recording round `fail_at_round` (after the checkpoint of round 4)."""
    append = MetricsLog.append

    def failing(self, metrics):
        if metrics["round"] == fail_at_round:
            raise KeyboardInterrupt
        return append(self, metrics)

    monkeypatch.setattr(MetricsLog, "append", failing)
    with pytest.raises(KeyboardInterrupt):
        rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / name, progress=False)
    monkeypatch.setattr(MetricsLog, "append", append)
    return tmp_path / name


@pytest.mark.parametrize("workload", [
    ["engine.backend=local", "algorithm.name=fedavgm"],
    ["engine.backend=local", "algorithm.name=gradma", "algorithm.memory_size=10"],
    ["engine.backend=local", "algorithm.name=fedlalr", "algorithm.lr_local=0.002", "train.lr_decay=0.9",
     "train.interval=adaptive", "train.interval_unit=steps", "algorithm.vhat_agg=max"],
    ["engine.backend=local", "algorithm.name=fedadam", "algorithm.bias_correction=true", "selection.selector=acs"],
    ["engine.backend=local", "algorithm.name=fedmos", "algorithm.lr_local=0.05", "selection.selector=cacs",
     "selection.cacs_warmup_rounds=2", "selection.cacs_clusters=3"],
    ["engine.backend=local", "algorithm.name=fedcomgate", "compression.name=top_k", "algorithm.memory=true"],
    ["engine.backend=local", "algorithm.name=scaffold"],
    # A stateful aggregation rule (its last aggregate), bucketing's and an attack's draws.
    ["engine.backend=local", "aggregation.rule=centered_clipping", "aggregation.clip_radius=0.5",
     "aggregation.bucket_size=2", "adversary.attack=gaussian", "adversary.fraction=0.2", "adversary.noise_std=1.0"],
    # A stateful attack (mimic's target) and adaptive clipping's norm.
    ["engine.backend=local", "adversary.attack=mimic", "adversary.fraction=0.2"],
    ["engine.backend=local", "privacy.mechanism=gaussian", "privacy.clip_norm=0.5", "privacy.delta=1e-5",
     "privacy.noise_multiplier=0.2", "privacy.adaptive_clipping=true", "privacy.clip_count_stddev=1.0"],
    ["engine.backend=local", "algorithm.name=fedavg", "train.round_policy=async_buffered", "train.buffer_size=4",
     "train.concurrency=9", "systems.step_time_spread=1.0", "train.staleness_weight=sqrt"],
])
def test_resume_after_interruption_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch, workload):
    overrides = SYNTHETIC_MLP + ROUNDS + workload
    whole = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "whole", progress=False)
    run_dir = interrupted(tmp_path, overrides, monkeypatch)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert not (run_dir / "checkpoint.pt.tmp").exists()
    resumed = rayfed.resume(run_dir, progress=False)
    assert_same_run(whole, resumed)
    # CACS's clusters come back with the checkpoint: no second warm-up
    assert resumed.summary.get("selection_warmup") == whole.summary.get("selection_warmup")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == list(range(1, 8))
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 7


@pytest.mark.slow
def test_resume_on_the_ray_engine_restores_client_states_to_their_workers(tmp_path, monkeypatch, ray_cluster):
    """Held to the local engine's uninterrupted run, which has the ray engine's bits (test_engine_equivalence):
    an uninterrupted ray run would start three more actor processes."""
    overrides = SYNTHETIC_MLP + ROUNDS + ["algorithm.name=mifa"]
    whole = rayfed.run(rayfed.load_config(None, overrides + ["engine.backend=local"]), run_dir=tmp_path / "whole",
                       progress=False)
    overrides += [*ON_RAY, "engine.num_workers=2"]
    resumed = rayfed.resume(interrupted(tmp_path, overrides, monkeypatch), progress=False)
    assert_same_run(whole, resumed)
    assert resumed.summary["client_state_bytes"] == whole.summary["client_state_bytes"] > 0


@pytest.mark.parametrize("name", sorted(ALGORITHMS.names()))
def test_every_algorithms_state_is_written_and_read_back_safely(tmp_path, name):
    """Checkpoint bodies are read with weights_only=True: every state class must be allowed, and
    loading a checkpoint gives back what was saved."""
    overrides = SYNTHETIC_MLP + ["engine.backend=local", "train.rounds=3", "train.checkpoint_every=2",
                                 f"algorithm.name={name}"]
    if name in ("gradma", "gradma_s"):
        overrides.append("algorithm.memory_size=10")
    rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / name, progress=False)
    checkpoint = read_checkpoint(tmp_path / name)
    assert checkpoint.rounds_completed == 2 and checkpoint.algorithm == name
    assert checkpoint.server["virtual_time_s"] > 0


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """A MIFA run stopped after round 5 with the checkpoint of round 4, and a GradMA run's checkpoint."""
    root = tmp_path_factory.mktemp("resumable")
    overrides = SYNTHETIC_MLP + ROUNDS + ["engine.backend=local", "algorithm.name=mifa"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_dir = interrupted(root, overrides, monkeypatch)
    other = root / "gradma"
    rayfed.run(rayfed.load_config(None, SYNTHETIC_MLP + ROUNDS + ["engine.backend=local", "algorithm.name=gradma",
                                                                  "algorithm.memory_size=10"]),
               run_dir=other, progress=False)
    return run_dir, other


def flip_byte(path, offset_from_end=100):
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_header(path, **fields):
    data = path.read_bytes()
    header_line, _, body = data[len(MAGIC):].partition(b"\n")
    header = {**json.loads(header_line), **fields}
    path.write_bytes(MAGIC + json.dumps(header).encode() + b"\n" + body)


def rewrite_body(path, change, update_digest=False):
    """Changes the body, and with `update_digest` writes a matching digest, as someone who knows the format would."""
    data = path.read_bytes()
    header_line, _, body = data[len(MAGIC):].partition(b"\n")
    header = json.loads(header_line)
    payload = torch.load(io.BytesIO(body), weights_only=False)
    buffer = io.BytesIO()
    torch.save(change(payload), buffer)
    if update_digest:
        del header["sha256"]
        digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
        digest.update(buffer.getvalue())
        header["sha256"] = digest.hexdigest()
    path.write_bytes(MAGIC + json.dumps(header).encode() + b"\n" + buffer.getvalue())


class Exploit:
    def __reduce__(self):
        return os.system, ("touch exploited",)


def drop_a_client(payload):
    payload["client_states"].pop(next(iter(payload["client_states"])))
    return payload


def edit_config(run_dir, old, new):
    path = run_dir / "config.yaml"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))


def edit_metrics(run_dir, change):
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(change(lines)))


DAMAGES = {
    "a flipped byte in the checkpoint's body": (lambda d, o: flip_byte(d / "checkpoint.pt"),
                                                "checkpoint.pt is damaged: its bytes no longer match"),
    "a truncated checkpoint": (lambda d, o: (d / "checkpoint.pt").write_bytes((d / "checkpoint.pt").read_bytes()[:500]),
                               "checkpoint.pt is damaged"),
    "rounds_completed=-5": (lambda d, o: edit_header(d / "checkpoint.pt", rounds_completed=-5),
                            "checkpoint.pt is damaged: rounds_completed=-5"),
    "rounds_completed=3 in the header": (lambda d, o: edit_header(d / "checkpoint.pt", rounds_completed=3),
                                         "checkpoint.pt is damaged: its bytes no longer match"),
    "a garbled header": (lambda d, o: (d / "checkpoint.pt").write_bytes(MAGIC + b"{not json\n" + b"x" * 100),
                         "checkpoint.pt is damaged: its header is unreadable"),
    "an environment record that is not strings": (lambda d, o: edit_header(d / "checkpoint.pt",
                                                                            environment={"threads": 1}),
                                                  "checkpoint.pt is damaged: its header is unreadable"),
    "a dropped client state": (lambda d, o: rewrite_body(d / "checkpoint.pt", drop_a_client),
                               "checkpoint.pt is damaged: its bytes no longer match"),
    "a pickle that runs code, with a matching digest": (
        lambda d, o: rewrite_body(d / "checkpoint.pt", lambda payload: {**payload, "exploit": Exploit()}, True),
        "checkpoint.pt is damaged: its body cannot be read"),
    "a plain torch file": (lambda d, o: torch.save({"rounds_completed": 4}, d / "checkpoint.pt"),
                           "checkpoint.pt is not a rayfed checkpoint"),
    "no checkpoint": (lambda d, o: (d / "checkpoint.pt").unlink(), "has no checkpoint.pt to resume from"),
    "a checkpoint from another algorithm": (lambda d, o: shutil.copy(o / "checkpoint.pt", d / "checkpoint.pt"),
                                            "checkpoint.pt is from algorithm gradma with model mlp, but"),
    "config.yaml with another data.num_clients": (lambda d, o: edit_config(d, "num_clients: 30", "num_clients: 31"),
                                                  "config.yaml was changed after checkpoint.pt was written"),
    "config.yaml with another algorithm.name": (lambda d, o: edit_config(d, "name: mifa", "name: fedavg"),
                                                "checkpoint.pt is from algorithm mifa with model mlp, but"),
    "config.yaml that is not YAML": (lambda d, o: (d / "config.yaml").write_text("seed: [1\n"), "is not valid YAML"),
    "no config.yaml": (lambda d, o: (d / "config.yaml").unlink(), "is not a run directory"),
    "no metrics.jsonl": (lambda d, o: (d / "metrics.jsonl").unlink(), "metrics.jsonl is missing"),
    "a garbled metrics line": (lambda d, o: edit_metrics(d, lambda lines: [lines[0], "{oops\n", *lines[2:]]),
                               "metrics.jsonl line 2 is not JSON"),
    "metrics lines out of order": (lambda d, o: edit_metrics(d, lambda lines: [lines[1], lines[0], *lines[2:]]),
                                   "metrics.jsonl line 1 is not the record of round 1"),
    "a metrics line nested past JSON's depth": (lambda d, o: edit_metrics(
        d, lambda lines: [lines[0], "[" * 100000 + "\n", *lines[2:]]),
                                                "metrics.jsonl line 2 is not JSON"),
    "fewer metrics lines than the checkpoint's rounds": (lambda d, o: edit_metrics(d, lambda lines: lines[:2]),
                                                         "metrics.jsonl has 2 rounds but checkpoint.pt has 4"),
    "an edited metrics value": (lambda d, o: edit_metrics(d, lambda lines: [lines[0].replace('"round": 1', '"round": 1, '
                                                                                             '"extra": 1'),
                                                                            *lines[1:]]),
                                "metrics.jsonl does not hold the rounds checkpoint.pt was written after"),
}


def snapshot(run_dir):
    return {path.name: path.read_bytes() for path in sorted(run_dir.iterdir())}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_run_directory_is_refused_with_one_line_and_left_as_it_was(tmp_path, capsys, monkeypatch,
                                                                            resumable, damage):
    source, other = resumable
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    monkeypatch.chdir(tmp_path)
    change, expected = DAMAGES[damage]
    change(run_dir, other)
    before = snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rayfed: error: ") and expected in err, err
    assert snapshot(run_dir) == before
    assert not (tmp_path / "exploited").exists()


def test_the_undamaged_copy_resumes(tmp_path, capsys, resumable):
    """The table above damages copies of this directory: undamaged, it resumes and finishes."""
    run_dir = tmp_path / "run"
    shutil.copytree(resumable[0], run_dir)
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 7


def test_resume_arguments_and_finished_runs(tmp_path, capsys):
    done = tmp_path / "done"
    rayfed.run(rayfed.load_config(None, SYNTHETIC_MLP + ["engine.backend=local", "train.rounds=4",
                                                         "train.checkpoint_every=2"]),
               run_dir=done, progress=False)
    before = snapshot(done)
    assert main(["run", "--resume", str(done)]) == 0
    assert capsys.readouterr().out == (f"rayfed: {done} finished all its 4 rounds; nothing to resume (extend it with "
                                       f"train.rounds=N)\n")
    assert snapshot(done) == before
    assert main(["run", "--resume", ""]) == 2
    assert "--resume needs the run directory" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert main(["run", "--resume", str(done), "seed=3"]) == 2
    assert capsys.readouterr().err == ("rayfed: error: seed cannot change on resume: it decides the run's bits "
                                       "(a resume may change train.rounds and logging.*); start a new run to change "
                                       "it\n")
    assert main(["run", "--resume", str(done), "train.rounds=3"]) == 2
    assert capsys.readouterr().err == (f"rayfed: error: train.rounds=3 must be above the 4 rounds "
                                       f"{done / 'metrics.jsonl'} records\n")
    assert main(["run", "--resume", str(done), "other.yaml"]) == 2
    assert "--resume takes the run directory and key=value overrides alone" in capsys.readouterr().err
    assert snapshot(done) == before


def test_a_finished_run_extended_on_resume_ends_with_the_longer_runs_bits(tmp_path):
    overrides = SYNTHETIC_MLP + ["engine.backend=local", "train.checkpoint_every=2", "train.eval_every=2"]
    longer = rayfed.run(rayfed.load_config(None, overrides + ["train.rounds=6"]), run_dir=tmp_path / "six",
                        progress=False)
    rayfed.run(rayfed.load_config(None, overrides + ["train.rounds=4"]), run_dir=tmp_path / "four", progress=False)
    extended = rayfed.resume(tmp_path / "four", progress=False, overrides=["train.rounds=6"])
    assert torch.equal(extended.params, longer.params)
    deterministic = ("round", "train_loss", "test_accuracy", "test_loss", "bytes_up", "virtual_time_s")
    assert [{key: line.get(key) for key in deterministic} for line in extended.history] == \
        [{key: line.get(key) for key in deterministic} for line in longer.history]
    assert rayfed.load_config(tmp_path / "four" / "config.yaml").train.rounds == 6


class RaisesFromRoundFive(rayfed.Callback):
    def on_round_end(self, run, record):
        if record["round"] >= 5:
            raise RuntimeError("a bug in the callback")


def test_a_resume_drops_a_raising_callback_and_may_not_change_the_maths(tmp_path, monkeypatch):
    overrides = SYNTHETIC_MLP + ROUNDS + ["engine.backend=local"]
    whole = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "whole", progress=False)
    run_dir = tmp_path / "stuck"
    with pytest.raises(rayfed.RunStopped):
        raising = "logging.callbacks=[tests.test_checkpoint.RaisesFromRoundFive]"
        rayfed.run(rayfed.load_config(None, overrides + [raising]), run_dir=run_dir, progress=False)
    with pytest.raises(rayfed.RunStopped):
        rayfed.resume(run_dir, progress=False)
    resumed = rayfed.resume(run_dir, progress=False, overrides=["logging.callbacks=[]", "logging.tensorboard=true"])
    assert torch.equal(resumed.params, whole.params)
    assert rayfed.load_config(run_dir / "config.yaml").logging.callbacks == []
    assert any(path.name.startswith("events.out.tfevents") for path in run_dir.rglob("*"))


def test_an_edited_summary_does_not_hide_the_rounds_left(tmp_path, monkeypatch):
    """summary.json says finished, but metrics.jsonl and the checkpoint show an interrupted run."""
    overrides = SYNTHETIC_MLP + ROUNDS + ["engine.backend=local"]
    run_dir = interrupted(tmp_path, overrides, monkeypatch)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "finished", "rounds_completed": 7}))
    assert rayfed.resume(run_dir, progress=False).summary["rounds_completed"] == 7


def test_a_run_directory_written_before_newer_config_keys_resumes(tmp_path, monkeypatch, capsys):
    """config.yaml as an older rayfed wrote it, without the keys added since (their defaults keep
    the old behaviour), with its checkpoint: the resume ends with the uninterrupted run's bits."""
    import dataclasses
    import yaml
    from rayfed.checkpoint import config_sha256, write_checkpoint
    overrides = SYNTHETIC_MLP + ROUNDS + ["engine.backend=local"]
    whole = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "whole", progress=False)
    run_dir = interrupted(tmp_path, overrides, monkeypatch)
    older = yaml.safe_load((run_dir / "config.yaml").read_text())
    del older["train"]["target_accuracy"], older["train"]["target_loss"]
    del older["engine"]["cpu_isa"]
    older["logging"] = {"tensorboard": False}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(older, sort_keys=False))
    # Nor did its checkpoints record the environment (rayfed.provenance): nothing to compare, nothing said.
    write_checkpoint(run_dir, dataclasses.replace(read_checkpoint(run_dir), config_sha256=config_sha256(run_dir),
                                                  environment=None))
    assert b'"environment"' not in (run_dir / "checkpoint.pt").read_bytes().split(b"\n")[1]
    assert_same_run(whole, rayfed.resume(run_dir, progress=False))
    assert capsys.readouterr().err == ""
