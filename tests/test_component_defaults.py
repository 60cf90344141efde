"""What a component declares is what runs: an algorithm's defaults for the keys it declares, the
common keys included, are the run's, and every capability it does not declare is off and refused in
one line. `rayfed algorithms NAME`, `rayfed config`, the run's config.yaml and the run agree."""
import json
import textwrap

import pytest
import yaml

import rayfed
from rayfed.cli import main
from rayfed.config import Config
from rayfed.registry import ALGORITHMS

OVERRIDING = '''
import torch
import rayfed
from pydantic import Field
from typing import Literal


class OwnDefaults(rayfed.AlgorithmParams):
    lr_local: float = Field(0.375, description="client learning rate")
    lr_global: float = Field(1.5, description="server learning rate")
    agg_weighting: Literal["uniform", "num_samples"] = Field("num_samples", description="clients' weights")


@rayfed.register_algorithm("own_defaults")
class OwnDefaultsAverage(rayfed.Algorithm):
    """Plain averaging that reports the values it was built with."""

    Params = OwnDefaults
    server_lr = True
    weighted = True
    keeps_client_state = False

    def __init__(self, params, context):
        self.params = params

    def server_init(self, params, num_clients):
        return params.clone()

    def broadcast(self, state):
        return {"params": state}

    def global_params(self, state):
        return state

    def client_train(self, task, down, client_state):
        params, loss = rayfed.local_sgd(task, down["params"], self.params.lr_local)
        return rayfed.Upload({"change": params - down["params"]}, task.num_samples, {"train_loss": loss}), None

    def server_step(self, state, uploads, round_info):
        change = rayfed.weighted_average(uploads, "change", self.params.agg_weighting)
        return state + self.params.lr_global * change, {
            "built_lr_local": self.params.lr_local, "built_lr_global": self.params.lr_global,
            "built_num_samples_weights": float(self.params.agg_weighting == "num_samples")}


@rayfed.register_algorithm("declares_nothing")
class DeclaresNothing(OwnDefaultsAverage):
    """The same maths, declaring no capability."""

    Params = rayfed.AlgorithmParams
    server_lr = rayfed.Algorithm.server_lr
    weighted = rayfed.Algorithm.weighted
'''

RUN = ["engine.backend=local", "data.num_clients=8", "train.clients_per_round=4", "train.rounds=2",
       "train.eval_every=2"]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "defaults_plugin.py").write_text(OVERRIDING)
    yield ["plugins=[./defaults_plugin.py]"]
    for name in ("own_defaults", "declares_nothing"):
        ALGORITHMS.remove(name)


def test_a_plugins_defaults_for_the_common_keys_are_the_runs(plugin, tmp_path, capsys):
    config = rayfed.load_config(None, [*plugin, *RUN, "algorithm.name=own_defaults"])
    assert (config.algorithm.lr_local, config.algorithm.lr_global, config.algorithm.agg_weighting) == \
        (0.375, 1.5, "num_samples")

    result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["algorithm"]
    assert written == {"name": "own_defaults", "lr_local": 0.375, "lr_global": 1.5, "agg_weighting": "num_samples"}
    assert [(line["built_lr_local"], line["built_lr_global"], line["built_num_samples_weights"])
            for line in result.history] == [(0.375, 1.5, 1.0)] * 2

    assert main(["config", *plugin, *RUN, "algorithm.name=own_defaults"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["algorithm"]
    assert shown == written
    assert main(["algorithms", "own_defaults", *plugin]) == 0
    described = capsys.readouterr().out
    for row in ("lr_local       0.375", "lr_global      1.5", "agg_weighting  'num_samples'"):
        assert row in described


def test_keys_the_user_sets_still_win_over_the_plugins_defaults(plugin, tmp_path):
    (tmp_path / "run.yaml").write_text("algorithm:\n  name: own_defaults\n  lr_local: 0.1\n")
    config = rayfed.load_config(tmp_path / "run.yaml", [*plugin, *RUN, "algorithm.agg_weighting=uniform"])
    assert (config.algorithm.lr_local, config.algorithm.lr_global, config.algorithm.agg_weighting) == \
        (0.1, 1.5, "uniform")


def test_a_section_built_in_python_gets_the_named_algorithms_defaults(plugin):
    rayfed.load_config(None, plugin)
    config = Config(algorithm={"name": "own_defaults"})
    assert config.algorithm.agg_weighting == "num_samples" and config.algorithm.lr_local == 0.375
    assert rayfed.load_config(None).algorithm.model_dump() == {"name": "fedavgm", "lr_local": 0.02, "lr_global": 1.0,
                                                              "agg_weighting": "uniform", "beta1": 0.9}


@pytest.mark.parametrize("override, message", [
    ("train.round_policy=async_buffered",
     "train.round_policy=async_buffered does not apply to declares_nothing: its clients need the server's step of "
     "the round they trained in, which a buffered server never forms"),
    ("algorithm.lr_global=2", "algorithm.lr_global does not apply to declares_nothing, which has no server "
                              "learning rate"),
    ("algorithm.agg_weighting=num_samples", "algorithm.agg_weighting=num_samples does not apply to "
                                            "declares_nothing, which "),
    ("compression.name=qsgd", "compression.name=qsgd does not apply to declares_nothing, whose uploads are not one "
                              "model update"),
    ("engine.partial_sums=true", "engine.partial_sums does not apply to declares_nothing, whose server step reads "
                                 "each client's upload"),
])
def test_a_capability_not_declared_is_off_and_refused_in_one_line(plugin, capsys, override, message):
    assert main(["run", *plugin, *RUN, "algorithm.name=declares_nothing", override]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"rayfed: error: {message}") and error.count("\n") == 1


def test_every_capability_is_off_in_the_base_class():
    assert [name for name in ("server_lr", "weighted", "runs_async", "staleness_weighted", "takes_compression",
                              "vectorizable", "replies", "linear_uploads", "keeps_initial_model")
            if getattr(rayfed.Algorithm, name)] == []
    assert rayfed.Algorithm.compressed_upload is None and rayfed.Algorithm.model_needs is None


def test_what_rayfed_algorithms_shows_for_a_plugin_declaring_nothing(plugin, capsys):
    assert main(["algorithms", "declares_nothing", *plugin]) == 0
    described = capsys.readouterr().out
    assert "lr_global" not in described and "agg_weighting" not in described
    assert "train.round_policy=async_buffered: no" in described
    assert "engine.partial_sums: no" in described and "engine.vectorize: no" in described


def test_the_run_directory_records_what_ran(plugin, tmp_path):
    config = rayfed.load_config(None, [*plugin, *RUN, "algorithm.name=own_defaults", "train.rounds=1"])
    rayfed.run(config, run_dir=tmp_path / "again", progress=False)
    reloaded = rayfed.load_config(tmp_path / "again" / "config.yaml")
    assert reloaded.algorithm == config.algorithm
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["rounds_completed"] == 1
