"""Callbacks: what a run tells them and when, a run stopped by one, one that raises, callbacks
named in a config (plugins, import paths) with their errors, and train.target_accuracy."""
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

import rayfed
from rayfed.cli import main
from rayfed.errors import ConfigError, RunStopped
from rayfed.models import build_model
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run

LOCAL = SYNTHETIC_MLP + ["engine.backend=local"]
EXAMPLE = Path(__file__).parents[1] / "examples" / "callbacks" / "my_callbacks.py"


class Recorder(rayfed.Callback):
    """Everything the run tells it, in order, and the global model after every round."""

    def __init__(self):
        self.calls, self.records, self.models = [], [], []

    def on_run_start(self, run):
        self.calls.append(("start", run.rounds_completed, run.resumed_from))

    def on_round_end(self, run, record):
        self.calls.append(("round", record["round"]))
        self.records.append(record)
        self.models.append(run.global_params())
        record["train_loss"] = 1e9       # a copy: neither the file nor the run sees this

    def on_checkpoint(self, run, rounds_completed):
        self.calls.append(("checkpoint", rounds_completed))

    def on_rewind(self, run, rounds_completed):
        self.calls.append(("rewind", rounds_completed))

    def on_run_end(self, run, summary):
        self.calls.append(("end", summary and summary["status"]))
        self.summary, self.final = summary, run.global_params()


class StopAt(rayfed.Callback):
    def __init__(self, round: int):
        self.round = round

    def on_round_end(self, run, record):
        return rayfed.Stop(f"enough at {record['round']}") if record["round"] == self.round else None


class Raises(rayfed.Callback):
    def on_round_end(self, run, record):
        if record["round"] == 5:
            raise ValueError("tracker unreachable\nsecond line")


def lines(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_hooks_see_every_round_the_model_and_the_summary_without_changing_the_run(tmp_path):
    overrides = LOCAL + ["train.rounds=6", "train.checkpoint_every=2"]
    plain = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "plain", progress=False)
    recorder = Recorder()
    watched = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "watched", progress=False,
                         callbacks=[recorder])
    assert_same_run(plain, watched)
    assert recorder.calls == [("start", 0, None), ("round", 1), ("round", 2), ("checkpoint", 2), ("round", 3),
                              ("round", 4), ("checkpoint", 4), ("round", 5), ("round", 6), ("end", "finished")]
    assert [{**record, "train_loss": None} for record in recorder.records] == \
        [{**record, "train_loss": None} for record in lines(watched.run_dir)]
    assert [record["train_loss"] for record in lines(watched.run_dir)] == [m["train_loss"] for m in plain.history]
    assert recorder.summary == json.loads((watched.run_dir / "summary.json").read_text())
    assert torch.equal(recorder.models[-1], watched.params) and torch.equal(recorder.final, watched.params)
    assert not torch.equal(recorder.models[0], recorder.models[1])


def test_global_model_is_the_runs_model_holding_the_global_parameters(tmp_path):
    class Evaluate(rayfed.Callback):
        def on_run_end(self, run, summary):
            self.module = run.global_model()
            self.params = run.global_params()

    evaluate = Evaluate()
    result = rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False,
                        callbacks=[evaluate])
    flat = torch.cat([p.detach().reshape(-1) for p in evaluate.module.parameters()])
    assert torch.equal(flat, result.params) and not evaluate.module.training
    evaluate.params.add_(1.0)            # a copy
    assert torch.equal(result.params, flat)


def test_a_callback_stops_the_run_after_its_round_and_the_run_ends_normally(tmp_path, capsys):
    result = rayfed.run(rayfed.load_config(None, LOCAL + ["train.rounds=10"]), run_dir=tmp_path / "run",
                        progress=False, callbacks=[StopAt(3)])
    assert len(result.history) == 3 and len(lines(result.run_dir)) == 3
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert (summary["status"], summary["stopped_because"], summary["rounds_completed"]) == ("stopped", "enough at 3", 3)
    assert result.summary == summary


def test_a_callback_that_raises_stops_the_run_with_one_line_keeping_the_checkpoint(tmp_path, capsys):
    overrides = LOCAL + ["train.rounds=8", "train.checkpoint_every=2"]
    run_dir = tmp_path / "run"
    with pytest.raises(RunStopped) as stopped:
        rayfed.run(rayfed.load_config(None, overrides), run_dir=run_dir, progress=False, callbacks=[Raises()])
    assert str(stopped.value) == (f"callback tests.test_callbacks.Raises failed in on_round_end: ValueError: tracker "
                                  f"unreachable; {run_dir} keeps rounds 1-5; resume from the last checkpoint with: "
                                  f"rayfed run --resume {run_dir}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["rounds_completed"]) == ("callback_failed", 5)
    whole = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "whole", progress=False)
    recorder = Recorder()
    assert_same_run(whole, rayfed.resume(run_dir, progress=False, callbacks=[recorder]))
    assert recorder.calls[:3] == [("rewind", 4), ("start", 4, 4), ("round", 5)]


def test_a_callback_returning_something_else_than_a_stop_is_named(tmp_path):
    class Confused(rayfed.Callback):
        def on_round_end(self, run, record):
            return True

    with pytest.raises(RunStopped, match=r"^callback tests.test_callbacks.test_a_callback_returning_something_else_"
                                         r"than_a_stop_is_named.<locals>.Confused: on_round_end returned bool, not "
                                         r"None or rayfed.Stop; .* keeps rounds 1-1; there is no checkpoint"):
        rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False, callbacks=[Confused()])


class BadStop(rayfed.Callback):
    def __init__(self, *arguments):
        self.arguments = arguments

    def on_round_end(self, run, record):
        return rayfed.Stop(*self.arguments) if record["round"] == 2 else None


@pytest.mark.parametrize("arguments, error", [
    (("enough", [1]), "TypeError: rayfed.Stop: status must be a string, not list ([1])"),
    ((3,), "TypeError: rayfed.Stop: reason must be a string, not int (3)"),
    (("",), "ValueError: rayfed.Stop: reason must be one line of text, not ''"),
    (("two\nlines",), "ValueError: rayfed.Stop: reason must be one line of text, not 'two\\nlines'"),
    (("enough", "finished"), "ValueError: rayfed.Stop: status 'finished' is for a run that played all its rounds; a "
                             "Stop ends it early (its default status is 'stopped')"),
])
def test_a_callback_building_a_bad_stop_stops_the_run_with_one_line_naming_it(tmp_path, arguments, error):
    """Once, `status=[1]` ended the run normally and landed in summary.json."""
    run_dir = tmp_path / "run"
    with pytest.raises(RunStopped) as stopped:
        rayfed.run(rayfed.load_config(None, LOCAL), run_dir=run_dir, progress=False, callbacks=[BadStop(*arguments)])
    assert str(stopped.value) == (f"callback tests.test_callbacks.BadStop failed in on_round_end: {error}; {run_dir} "
                                  f"keeps rounds 1-2; there is no checkpoint to resume from")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["rounds_completed"]) == ("callback_failed", 2)


def test_a_stop_with_a_status_of_its_own_records_it(tmp_path):
    result = rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False,
                        callbacks=[BadStop("plateau reached", "plateau")])
    assert (result.summary["status"], result.summary["stopped_because"]) == ("plateau", "plateau reached")


def test_a_failing_run_end_fails_the_command_but_keeps_the_finished_summary(tmp_path):
    class Broken(rayfed.Callback):
        def on_run_end(self, run, summary):
            raise OSError("disk full")

    recorder = Recorder()
    with pytest.raises(RunStopped, match="failed in on_run_end: OSError: disk full"):
        rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False,
                   callbacks=[Broken(), recorder])
    assert recorder.calls[-1] == ("end", "finished")       # the others still ended
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "finished"


def test_target_accuracy_stops_the_quick_start_at_the_first_round_that_reaches_it(tmp_path, capsys):
    assert main(["run", "engine.backend=local", "train.target_accuracy=0.7", "--out", str(tmp_path / "run"),
                 "--quiet"]) == 0
    records = lines(tmp_path / "run")
    evaluated = [record for record in records if record.get("test_accuracy") is not None]
    first = next(record["round"] for record in evaluated if record["test_accuracy"] >= 0.7)
    assert records[-1]["round"] == first and all(r["test_accuracy"] < 0.7 for r in evaluated[:-1])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["target_round"], summary["rounds_completed"]) == ("reached_target", first,
                                                                                          first)
    assert summary["stopped_because"] == (f"round {first} reached its target: test accuracy "
                                          f"{records[-1]['test_accuracy']:.4f} >= train.target_accuracy=0.7")
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    assert f"| {first}.0 ± – |" in (tmp_path / "report" / "report.md").read_text()
    with pytest.raises(rayfed.RunFinished, match=f"reached its target in round {first}; nothing to resume"):
        rayfed.resume(tmp_path / "run")


def test_target_loss_and_accuracy_must_both_be_reached(tmp_path):
    result = rayfed.run(rayfed.load_config(None, LOCAL + ["train.rounds=12", "train.target_accuracy=0.01",
                                                          "train.target_loss=1e-9"]),
                        run_dir=tmp_path / "run", progress=False)
    assert result.summary["status"] == "finished" and len(result.history) == 12


@pytest.fixture
def forget_plugins():
    yield
    from tests.test_plugins import forget_plugins as forget
    forget()


def test_callbacks_named_in_the_config_from_a_plugin_file_and_an_import_path(tmp_path, monkeypatch, capsys,
                                                                            forget_plugins):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    entries = ("[{name: save_model, every: 2, folder: saved}, "
               "{name: tests.test_callbacks.StopAt, round: 3}]")
    code = main(["run", *LOCAL, "train.rounds=10", f"plugins=[{EXAMPLE}]", f"logging.callbacks={entries}",
                 "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 0
    assert sorted(path.name for path in (tmp_path / "run" / "saved").iterdir()) == ["round00002.pt"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stopped_because"] == "enough at 3"
    saved = torch.load(tmp_path / "run" / "saved" / "round00002.pt")
    two_rounds = rayfed.run(rayfed.load_config(None, LOCAL + ["train.rounds=2"]), run_dir=tmp_path / "two",
                            progress=False)
    module = build_model("mlp", (60,), 10, [16])
    module.load_state_dict(saved)
    assert torch.equal(torch.cat([p.reshape(-1) for p in module.parameters()]), two_rounds.params)
    assert torch.equal(torch.cat([b.reshape(-1) for b in module.buffers() if b.is_floating_point()]),
                       two_rounds.buffers)


@pytest.mark.parametrize("entries, message", [
    ("[nosuch]", "logging.callbacks[0]='nosuch' is neither a registered callback (registered: none) nor an "
                 "importable module.Class path"),
    ("[nosuch_module.Thing]", "logging.callbacks[0]='nosuch_module.Thing': cannot import nosuch_module: "
                              "ModuleNotFoundError: No module named 'nosuch_module'"),
    ("[json.Nothing]", "logging.callbacks[0]='json.Nothing': module json has no Nothing"),
    ("[json.JSONDecoder]", "logging.callbacks[0]: json.JSONDecoder is not a subclass of rayfed.Callback"),
    ("[{every: 3}]", "logging.callbacks[0] is a mapping without a name: give {name: NAME, ...its keyword arguments}"),
    ("[{name: tests.test_callbacks.StopAt, round: 3, every: 1}]",
     "logging.callbacks[0]: tests.test_callbacks.StopAt does not take these arguments (round=3, every=1): got an "
     "unexpected keyword argument 'every'"),
    ("[tests.test_callbacks.StopAt]", "logging.callbacks[0]: tests.test_callbacks.StopAt does not take these "
                                      "arguments (): missing a required argument: 'round'"),
])
def test_bad_callback_entries_are_one_line_and_exit_2_before_anything_runs(tmp_path, capsys, entries, message):
    assert main(["run", *LOCAL, f"logging.callbacks={entries}", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == f"rayfed: error: {message}"
    assert not (tmp_path / "run").exists()


def test_a_callback_whose_constructor_fails_is_one_line_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match=r"^logging.callbacks\[0\]: tests.test_callbacks.StopAt\(round='x'\) "
                                          r"failed: TypeError: boom$"):
        StopAt.__init__, original = _failing_init, StopAt.__init__
        try:
            rayfed.run(rayfed.load_config(None, LOCAL + ["logging.callbacks=[{name: tests.test_callbacks.StopAt, "
                                                         "round: x}]"]), run_dir=tmp_path / "run")
        finally:
            StopAt.__init__ = original
    assert not (tmp_path / "run").exists()


def _failing_init(self, round):
    raise TypeError("boom")


def test_rayfed_run_refuses_what_is_not_a_callback(tmp_path):
    with pytest.raises(ConfigError, match=r"^callbacks: <function .*> is not a rayfed.Callback$"):
        rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", callbacks=[lambda run: None])


@pytest.mark.slow
def test_plateau_callback_named_in_the_config_on_the_ray_engine(tmp_path, ray_cluster, capsys, forget_plugins):
    """The example plugin's callback, named in the config: the run on the ray engine ends at the
    plateau with the bits of the same rounds on the local engine."""
    overrides = [*SYNTHETIC_MLP, "train.rounds=40", "train.eval_every=1", f"plugins=[{EXAMPLE}]",
                 "logging.callbacks=[{name: stop_on_plateau, patience: 2}]"]
    for backend, engine in (("ray", ON_RAY), ("local", ["engine.backend=local"])):
        assert main(["run", *overrides, *engine, "--out", str(tmp_path / backend), "--quiet"]) == 0
    ray_run, local_run = lines(tmp_path / "ray"), lines(tmp_path / "local")
    assert len(ray_run) < 40
    drop = ("wall_time_s", "phase_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in ray_run] == \
        [{k: v for k, v in r.items() if k not in drop} for r in local_run]
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "has not improved in 2 evaluations" in summary["stopped_because"]
    assert not math.isnan(summary["final_test_accuracy"])


# The quick-start's records without their wall-clock fields, as the run wrote them before its
# outputs became callbacks (commit f0dd0e9, logging.tensorboard=true): sha256 of the JSON list with
# sorted keys, for each instruction set PyTorch picks its CPU kernels by. Its AVX-512 kernels round
# the losses differently from its AVX2 ones in the ninth digit; the accuracies are the same.
QUICK_START_RECORDS = {"AVX2": "3601d5572a2bb6119d63791529d33122a695dd64a7af5cb5721727ef37018111",
                       "AVX512": "bc4559c9496ca99a43e85b2955ade6959c26063d0b6f4428aea27cac3fa07a5a"}


@pytest.mark.slow
def test_the_built_in_writers_write_the_quick_start_as_before(tmp_path):
    from rayfed.metrics import WALL_CLOCK_KEYS
    from tests.test_tensorboard import assert_events_are_the_metrics
    result = rayfed.run(rayfed.load_config(None, ["engine.backend=local", "logging.tensorboard=true",
                                                  "train.checkpoint_every=250"]),
                        run_dir=tmp_path / "run", progress=False)
    records = [{key: value for key, value in record.items() if key not in WALL_CLOCK_KEYS}
               for record in lines(result.run_dir)]
    # The clients' fields came later: without them the records are as before, and their means are
    # the fields the records had.
    client_keys = {f"client_{name}_{kind}" for name in ("train_loss", "local_steps") for kind in ("mean", "min", "max")}
    assert all(set(record) >= client_keys for record in records)
    assert all((record["client_train_loss_mean"], record["client_local_steps_mean"]) ==
               (record["train_loss"], record["local_steps"]) for record in records)
    before = [{key: value for key, value in record.items() if key not in client_keys} for record in records]
    capability = torch.backends.cpu.get_cpu_capability()
    assert capability in QUICK_START_RECORDS, f"no reference records for PyTorch's {capability} kernels"
    assert hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest() == QUICK_START_RECORDS[capability]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert (summary["final_test_accuracy"], summary["best_test_accuracy"], summary["best_round"]) == \
        (0.7597200622083982, 0.7884914463452566, 720)
    assert_events_are_the_metrics(result.run_dir, 1000)
