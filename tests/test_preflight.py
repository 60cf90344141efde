"""The preflight: the schema imports nothing above the typed fields and the registries, no module
imports in a circle, and every check that needs the world says its problem in one line before
round 1 (the loaded samples' shape, BatchNorm's clients of one sample, a model builder that returns
nothing, work beyond any run's, a target that no evaluation can meet)."""
import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rayfed
import rayfed.api
from rayfed.cli import main
from rayfed.registry import DATASETS, MODELS

ROOT = Path(__file__).parents[1]
CIRCLES = ROOT.parent / "shared" / "tools" / "import_cycles.py"


def rayfed_imports(module: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rayfed"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("rayfed"))
    return names


def test_the_schema_imports_nothing_of_rayfed_above_fields_registries_and_bounded_files():
    assert rayfed_imports(ROOT / "rayfed" / "config.py") == {"rayfed.fields", "rayfed.registry", "rayfed.errors",
                                                            "rayfed.input_files", "rayfed.algorithms.params"}
    assert rayfed_imports(ROOT / "rayfed" / "input_files.py") == {"rayfed.errors"}
    assert rayfed_imports(ROOT / "rayfed" / "algorithms" / "params.py") == {"rayfed.fields"}
    assert rayfed_imports(ROOT / "rayfed" / "registry.py") == {"rayfed.errors"}


@pytest.mark.skipif(not CIRCLES.is_file(), reason="the workplace's import-circle tool is beside the checkout")
def test_no_module_imports_in_a_circle():
    found = subprocess.run([sys.executable, str(CIRCLES), "rayfed"], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout


def one_line_error(capsys, *items) -> str:
    assert main(["run", "--quiet", *items]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error.removeprefix("rayfed: error: ").rstrip("\n")


def test_work_beyond_the_bound_is_refused_and_a_bound_of_null_lifts_it(capsys):
    assert one_line_error(capsys, "train.local_epochs=10000000") == (
        "this run computes about 1e14 sample gradients (1000 rounds x 10 clients x 160000000 steps x 64 samples), "
        "over train.max_sample_gradients=1e11; raise it (or set it to null) if you mean it")
    assert one_line_error(capsys, "selection.selector=cacs", "selection.cacs_warmup_rounds=10000000").startswith(
        "this run computes about 3.2e11 sample gradients (1000 rounds x 10 clients x 5 steps x 64 samples, and "
        "10000000 warm-up rounds x 100 clients)")
    assert rayfed.load_config(None, ["train.local_epochs=10000000", "train.max_sample_gradients=null"])


def test_a_long_run_says_its_estimate_when_it_starts(tmp_path, capsys, monkeypatch):
    from rayfed.preflight import estimated_work
    config = rayfed.load_config(None, ["train.rounds=3", "train.batch_size=50", "train.local_steps=2000000",
                                       "data.num_clients=10", "train.eval_every=1"])
    assert estimated_work(config) == (3e9, "3 rounds x 10 clients x 2000000 steps x 50 samples")
    monkeypatch.setattr(rayfed.api, "ANNOUNCED_WORK", 900)
    assert main(["run", "--quiet", "engine.backend=local", "train.rounds=3", "data.num_clients=10",
                 "train.eval_every=1", "train.batch_size=10", "train.local_steps=3", f"--out={tmp_path / 'run'}"]) == 0
    assert capsys.readouterr().err == ("rayfed: this run computes about 900 sample gradients (3 rounds x 10 clients x "
                                       "3 steps x 10 samples)\n")


def test_a_target_that_only_the_last_evaluation_could_meet_is_refused(capsys):
    assert one_line_error(capsys, "train.target_accuracy=0.5", "train.eval_every=2000") == (
        "train.target_accuracy and train.target_loss stop the run at an evaluated round, but with "
        "train.eval_every=2000 and train.rounds=1000 the only evaluation is after the last round; lower "
        "train.eval_every")


def test_a_client_of_one_sample_under_batchnorm_is_refused_before_round_1(tmp_path, capsys):
    assert one_line_error(capsys, "data.dataset=digits", "data.partition=feddyn", "data.num_clients=1442",
                          "engine.backend=local", f"--out={tmp_path / 'run'}").startswith(
        "client 0 holds one training sample (") and not (tmp_path / "run").exists()
    assert main(["run", "--quiet", "data.dataset=digits", "data.partition=feddyn", "data.num_clients=1442",
                 "engine.backend=local", "model.name=relu_mlp", "train.rounds=1", f"--out={tmp_path / 'other'}"]) == 0


BAD = '''
import numpy as np
import torch
import rayfed

@rayfed.register_dataset("flat_but_declared_square", input_shape=(1, 4, 4), num_classes=2, default_model="logreg",
                         num_samples=40)
def load(data, seed):
    x = np.zeros((40, 16), np.float32)
    y = np.arange(40) % 2
    return rayfed.Dataset("flat_but_declared_square", x[:32], y[:32], x[32:], y[32:], 2, (1, 4, 4))

@rayfed.register_model("forgot_return")
def forgot_return(input_shape, num_classes):
    torch.nn.Linear(int(np.prod(input_shape)), num_classes)
'''


@pytest.fixture
def bad_plugin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad_components.py").write_text(BAD)
    yield "plugins=[./bad_components.py]"
    DATASETS.remove("flat_but_declared_square")
    MODELS.remove("forgot_return")


def test_samples_of_another_shape_than_declared_are_one_line(bad_plugin, capsys, tmp_path):
    assert one_line_error(capsys, bad_plugin, "data.dataset=flat_but_declared_square", "engine.backend=local",
                          "data.num_clients=4", "train.clients_per_round=2") == (
        "data.dataset=flat_but_declared_square declares input_shape=(1, 4, 4), but its training samples have shape "
        "(16,); fix its loader or its registration (rayfed.register_dataset)")


def test_a_model_builder_that_returns_nothing_is_one_line(bad_plugin, capsys, tmp_path):
    assert one_line_error(capsys, bad_plugin, "model.name=forgot_return") == (
        f"model.name=forgot_return: its builder forgot_return (in {tmp_path / 'bad_components.py'}) returned None, "
        f"not a torch.nn.Module (a missing return?)")
