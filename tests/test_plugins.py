"""Plugins: a researcher's algorithm, model and dataset in one file outside the package, used by
name from Python, from the CLI (`plugins:`) and from an installed package's entry point; on the
ray engine bitwise as on the local one; resumed and swept like the built-ins; and the one-line
errors of a plugin that cannot be used."""
import hashlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

import rayfed
from rayfed import plugins
from rayfed.cli import main
from rayfed.registry import REGISTRIES, plugin_entries
from tests.test_checkpoint import interrupted
from tests.test_engine_equivalence import ON_RAY, assert_same_run

EXAMPLE = Path(__file__).parents[1] / "examples" / "plugins" / "my_plugins.py"
RUN = ["plugins=[./my_plugins.py]", "algorithm.name=my_fedavg_nesterov", "algorithm.momentum=0.8",
       "algorithm.lr_local=0.05", "data.dataset=my_stripes", "data.num_clients=12", "train.clients_per_round=4",
       "train.rounds=6", "train.eval_every=2", "train.batch_size=16", "train.local_steps=3"]


def forget_plugins():
    """What plugins registered, and the files loaded, are gone: the next test starts clean."""
    for entry in plugin_entries():
        REGISTRIES[entry.kind].remove(entry.name)
    plugins._loaded.clear()


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A directory outside the repository holding a copy of the example."""
    folder = tmp_path_factory.mktemp("outside")
    shutil.copy(EXAMPLE, folder / "my_plugins.py")
    yield folder
    forget_plugins()


@pytest.fixture
def in_outside(outside, monkeypatch):
    monkeypatch.chdir(outside)
    return outside


def run(directory, overrides, name):
    return rayfed.run(rayfed.load_config(None, overrides), run_dir=directory / name, progress=False)


@pytest.mark.slow
def test_the_example_runs_bitwise_alike_on_both_engines_and_resumes(in_outside, ray_cluster, monkeypatch, tmp_path):
    local = run(tmp_path, RUN + ["engine.backend=local"], "local")
    assert local.summary["final_test_accuracy"] > 0.5        # four classes: it learns
    on_ray = run(tmp_path, RUN + [*ON_RAY, "engine.num_workers=2"], "ray")
    assert_same_run(local, on_ray)
    overrides = RUN + [*ON_RAY, "engine.num_workers=2", "train.checkpoint_every=2"]
    resumed = rayfed.resume(interrupted(tmp_path, overrides, monkeypatch, fail_at_round=5), progress=False)
    assert_same_run(local, resumed)
    recorded = {"path": str(in_outside / "my_plugins.py"),
                "sha256": hashlib.sha256((in_outside / "my_plugins.py").read_bytes()).hexdigest()}
    assert yaml.safe_load((tmp_path / "local" / "config.yaml").read_text())["plugins"] == [recorded]


def test_the_example_from_python_after_importing_it(outside, tmp_path, monkeypatch):
    """The Python path: the file imported by the user's own code, no plugins key."""
    monkeypatch.syspath_prepend(str(outside))
    monkeypatch.chdir(outside)
    via_key = run(tmp_path, RUN + ["engine.backend=local"], "key")
    forget_plugins()
    import my_plugins      # noqa: F401  (registers its components)
    try:
        imported = run(tmp_path, RUN[1:] + ["engine.backend=local"], "import")
        assert_same_run(via_key, imported)
    finally:
        forget_plugins()
        sys.modules.pop("my_plugins")


@pytest.mark.slow
def test_the_example_as_a_two_trial_sweep(in_outside):
    base = {"plugins": ["./my_plugins.py"], "algorithm": {"name": "my_fedavg_nesterov"},
            "data": {"dataset": "my_stripes", "num_clients": 12},
            "train": {"rounds": 3, "clients_per_round": 4, "batch_size": 16}, "engine": {"backend": "local"}}
    Path("s.yaml").write_text(yaml.safe_dump({"base": base, "grid": {"algorithm.momentum": [0.0, 0.9]}}))
    assert main(["sweep", "s.yaml", "--out", "sweep", "--quiet"]) == 0
    summaries = [json.loads(path.read_text()) for path in sorted(Path("sweep").glob("trials/*/summary.json"))]
    assert [summary["status"] for summary in summaries] == ["finished", "finished"]
    assert summaries[0]["final_test_accuracy"] != summaries[1]["final_test_accuracy"]


def test_a_plugins_parameters_are_validated_like_the_built_ins(in_outside, capsys):
    with pytest.raises(rayfed.ConfigError, match=r"^algorithm.momentum=1.5 must be in \[0, 1\)$"):
        rayfed.load_config(None, RUN + ["algorithm.momentum=1.5"])
    with pytest.raises(rayfed.ConfigError, match=r"^unknown key 'algorithm.momentun' \(did you mean "
                                                 r"'algorithm.momentum'\?\)$"):
        rayfed.load_config(None, RUN + ["algorithm.momentun=0.5"])
    with pytest.raises(rayfed.ConfigError, match="^algorithm.beta1 is not a parameter of my_fedavg_nesterov "
                                                 r"\(it takes algorithm.lr_local, algorithm.lr_global, "
                                                 r"algorithm.agg_weighting, algorithm.momentum\)$"):
        rayfed.load_config(None, RUN + ["algorithm.beta1=0.5"])
    assert rayfed.load_config(None, RUN + ["algorithm.momentum=1e-1"]).algorithm.momentum == 0.1
    assert main(["config", *RUN, "algorithm.momentum=2"]) == 2
    assert capsys.readouterr().err == "rayfed: error: algorithm.momentum=2.0 must be in [0, 1)\n"


def test_rayfed_algorithms_lists_plugins_and_describes_their_parameters(in_outside, capsys):
    assert main(["algorithms"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[0] == "fedavgm" and len(listed) >= 24
    assert main(["algorithms", "plugins=[./my_plugins.py]"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split(maxsplit=1) == [
        "my_fedavg_nesterov", "FedAvg with server Nesterov momentum (Sutskever et al., ICML 2013), an example plugin."]
    assert main(["algorithms", "my_fedavg_nesterov", "plugins=[./my_plugins.py]"]) == 0
    described = capsys.readouterr().out
    assert "  momentum       0.9        in [0, 1)                     the server's Nesterov momentum beta" in described
    assert "  state classes: NesterovState" in described
    assert main(["algorithms", "fedavgg"]) == 2
    assert "did you mean 'fedavg'" in capsys.readouterr().err


def write(folder, name, source):
    (folder / name).write_text(textwrap.dedent(source))
    return f"./{name}"


@pytest.mark.parametrize("source, message", [
    ("""
     import rayfed
     @rayfed.register_model("logreg")
     def logreg(input_shape, num_classes):
         return None
     """, r"^plugin ./bad.py: model 'logreg' is already registered \(by rayfed.models.zoo\); "
          r"/\S+/bad\.py must register it under another name$"),
    ("""
     import rayfed
     raise RuntimeError("no GPU here\\nsecond line")
     """, r"^plugin ./bad.py failed to import: RuntimeError: no GPU here$"),
    ("def broken(:\n", r"^plugin ./bad.py failed to import: SyntaxError: "),
    ("""
     import rayfed
     @rayfed.register_algorithm("plain")
     class Plain:
         pass
     """, r"^plugin ./bad.py: register_algorithm\('plain'\) takes a subclass of rayfed.Algorithm"),
    ("""
     import rayfed
     from rayfed.algorithms.fedavg import FedAvg
     @rayfed.register_algorithm("replying")
     class Replying(FedAvg):
         replies = True
     """, r"^plugin ./bad.py: algorithm 'replying': replies = True needs keeps_client_state = True \(client_finish "
          r"updates the clients' states with the reply\)$"),
])
def test_a_plugin_that_cannot_be_used_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, source, message):
    monkeypatch.chdir(tmp_path)
    spec = write(tmp_path, "bad.py", source)
    before = plugin_entries()
    with pytest.raises(rayfed.ConfigError, match=message):
        rayfed.load_config(None, [f"plugins=[{spec}]"])
    assert main(["config", f"plugins=[{spec}]"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert plugin_entries() == before      # nothing it registered before failing stays


def test_missing_plugins_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(rayfed.ConfigError, match=r"^plugins: ./nowhere.py is not a file"):
        rayfed.load_config(None, ["plugins=[./nowhere.py]"])
    with pytest.raises(rayfed.ConfigError, match="^plugin no_such_module_here failed to import: "
                                                 "ModuleNotFoundError: No module named 'no_such_module_here'$"):
        rayfed.load_config(None, ["plugins=[no_such_module_here]"])


def test_a_state_class_the_plugin_does_not_declare_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write(tmp_path, "undeclared.py", """
        from dataclasses import dataclass
        import rayfed
        from rayfed.algorithms.fedavg import FedAvg

        @dataclass
        class Extra:
            count: int

        @rayfed.register_algorithm("undeclared")
        class Undeclared(FedAvg):
            state_classes = FedAvg.state_classes

            def client_init(self, client_id):
                return Extra(0)

            def client_train(self, task, down, client_state):
                upload, _ = super().client_train(task, down, None)
                return upload, Extra(client_state.count + 1)
        """)
    try:
        with pytest.raises(rayfed.ConfigError, match="^algorithm 'undeclared' returned a client state of class Extra, "
                                                     r"which its state_classes do not list \(FedAvgMState, ServerOptimizerState\)"):
            rayfed.run(rayfed.load_config(None, [f"plugins=[{spec}]", "algorithm.name=undeclared",
                                                 "engine.backend=local", "train.rounds=2"]),
                       run_dir=tmp_path / "run", progress=False)
        assert not (tmp_path / "run").exists()
    finally:
        forget_plugins()


def test_a_client_state_from_an_algorithm_that_keeps_none_stops_the_run(tmp_path, monkeypatch):
    """Clients that keep no state train on any worker and commit nothing: a state would be lost."""
    monkeypatch.chdir(tmp_path)
    spec = write(tmp_path, "stateful.py", """
        import rayfed
        from rayfed.algorithms.fedavg import FedAvg

        @rayfed.register_algorithm("secretly_stateful")
        class SecretlyStateful(FedAvg):
            def client_train(self, task, down, client_state):
                upload, _ = super().client_train(task, down, None)
                return upload, 1
        """)
    try:
        with pytest.raises(rayfed.ConfigError, match="^algorithm 'secretly_stateful' returned a client state of class "
                                                     "int but declares keeps_client_state = False; set it to True$"):
            rayfed.run(rayfed.load_config(None, [f"plugins=[{spec}]", "algorithm.name=secretly_stateful",
                                                 "engine.backend=local", "train.rounds=2"]),
                       run_dir=tmp_path / "run", progress=False)
    finally:
        forget_plugins()


def test_an_installed_packages_entry_point_registers_its_components(tmp_path, monkeypatch):
    package = tmp_path / "package"
    (package / "ep_plugin").mkdir(parents=True)
    (package / "ep_plugin" / "__init__.py").write_text(textwrap.dedent("""
        import rayfed
        from rayfed.algorithms.fedavg import FedAvg

        @rayfed.register_algorithm("ep_fedavg")
        class EntryPointFedAvg(FedAvg):
            '''FedAvg under another name, from an installed package.'''
        """))
    (package / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "ep-plugin"
        version = "0.1"
        [project.entry-points."rayfed.plugins"]
        ep = "ep_plugin"
        """))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(package)], check=True)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    try:
        config = rayfed.load_config(None, ["algorithm.name=ep_fedavg", "engine.backend=local", "train.rounds=2"])
        assert config.algorithm.name == "ep_fedavg"
        result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
        reference = rayfed.run(rayfed.load_config(None, ["algorithm.name=fedavg", "engine.backend=local",
                                                         "train.rounds=2"]), run_dir=tmp_path / "fedavg", progress=False)
        assert torch.equal(result.params, reference.params)
    finally:
        forget_plugins()
        sys.modules.pop("ep_plugin", None)


def test_the_memory_check_counts_declared_client_state(monkeypatch):
    """SCAFFOLD keeps every client's control variate: N x d floats the check must count."""
    from tests.algorithm_checks import assert_memory_check_counts_client_state
    assert_memory_check_counts_client_state(monkeypatch, ["algorithm.name=scaffold"])

def test_a_plugin_run_resumes_from_another_directory_and_refuses_a_changed_plugin(tmp_path, monkeypatch, capsys):
    """config.yaml records the plugin by absolute path and SHA-256: found from anywhere, pinned to its code."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    shutil.copy(EXAMPLE, project / "my_plugins.py")
    monkeypatch.chdir(project)
    try:
        overrides = [*RUN, "engine.backend=local", "train.checkpoint_every=2"]
        run_dir = interrupted(tmp_path, overrides, monkeypatch, fail_at_round=5)
        forget_plugins()
        monkeypatch.chdir(elsewhere)
        assert main(["run", "--resume", str(run_dir), "--quiet"]) == 0
        capsys.readouterr()
        forget_plugins()
        (project / "my_plugins.py").write_text((project / "my_plugins.py").read_text() + "\n# edited\n")
        assert main(["run", str(run_dir / "config.yaml"), "--quiet"]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"rayfed: error: plugin {project / 'my_plugins.py'} changed since the run that "
                                f"recorded it: SHA-256 ") and error.count("\n") == 1
    finally:
        forget_plugins()


def test_a_plugin_listed_twice_is_one_line_and_one_imported_by_the_user_is_that_module(in_outside, monkeypatch):
    with pytest.raises(rayfed.ConfigError, match=f"^plugins: {in_outside / 'my_plugins.py'} is listed twice$"):
        rayfed.load_config(None, ["plugins=[./my_plugins.py, my_plugins.py]"])
    forget_plugins()
    monkeypatch.syspath_prepend(str(in_outside))
    try:
        import my_plugins  # noqa: F401  (registers its components under the module name my_plugins)
        config = rayfed.load_config(None, RUN)
        assert config.algorithm.name == "my_fedavg_nesterov" and config.plugins[0].path == str(in_outside /
                                                                                               "my_plugins.py")
    finally:
        forget_plugins()
        sys.modules.pop("my_plugins", None)


def test_a_name_registered_twice_names_the_plugin_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("first", "second"):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent('''
            import rayfed
            @rayfed.register_callback("same_name")
            class Same(rayfed.Callback):
                pass
            '''))
    try:
        with pytest.raises(rayfed.ConfigError, match=re.escape(
                f"plugin ./second.py: callback 'same_name' is already registered (by {tmp_path / 'first.py'}); "
                f"{tmp_path / 'second.py'} must register it under another name")):
            rayfed.load_config(None, ["plugins=[./first.py, ./second.py]"])
    finally:
        forget_plugins()
