"""Config loading: YAML and overrides, types, resolution, and the round trip through config.yaml."""
import pytest

from rayfed.config import Config, all_keys, load_config, resolve
from rayfed.errors import ConfigError


def test_defaults_are_the_quick_start():
    config = load_config()
    assert (config.data.dataset, config.data.partition, config.model.name) == ("synthetic", "natural", "logreg")
    assert (config.algorithm.name, config.algorithm.beta1, config.algorithm.mu) == ("fedavgm", 0.9, None)
    assert (config.engine.backend, config.data.num_clients, config.train.clients_per_round) == ("ray", 100, 10)


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\ntrain:\n  rounds: 7\n  local_steps: 2\nalgorithm:\n  name: fedprox\n")
    config = load_config(path, ["train.rounds=9", "algorithm.mu=0.5", "model.hidden_sizes=[4, 5]"])
    assert (config.seed, config.train.rounds, config.train.local_steps) == (3, 9, 2)
    assert (config.algorithm.name, config.algorithm.mu, config.algorithm.beta1) == ("fedprox", 0.5, None)
    assert config.model.hidden_sizes == [4, 5]


def test_exponent_notation_without_a_dot_is_a_number():
    assert load_config(None, ["algorithm.lr_local=1e-3"]).algorithm.lr_local == 0.001
    with pytest.raises(ConfigError, match="algorithm.lr_local must be a number, got 'fast'"):
        load_config(None, ["algorithm.lr_local=fast"])


def test_integers_are_accepted_as_numbers_but_not_the_reverse():
    assert load_config(None, ["algorithm.lr_local=1"]).algorithm.lr_local == 1.0
    assert isinstance(load_config(None, ["algorithm.lr_local=1"]).algorithm.lr_local, float)
    with pytest.raises(ConfigError, match="train.rounds must be an integer"):
        load_config(None, ["train.rounds=true"])


def test_auto_choices_resolve_per_dataset():
    config = load_config(None, ["data.dataset=cifar10", "data.download=true"])
    assert (config.data.partition, config.model.name) == ("dirichlet", "lenet5")
    config = load_config(None, ["data.dataset=mnist", "data.download=true", "data.partition=shards"])
    assert (config.data.partition, config.model.name) == ("shards", "mlp")


def test_resolved_config_round_trips_through_yaml(tmp_path):
    config = load_config(None, ["algorithm.name=fedproxm", "seed=11", "engine.address=ray://head:10001"])
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert load_config(tmp_path / "config.yaml") == config
    assert resolve(config) == config


def test_local_backend_records_its_single_worker():
    assert load_config(None, ["engine.backend=local", "engine.num_workers=3"]).engine.num_workers == 1


def test_every_key_is_documented_in_the_readme():
    from pathlib import Path
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    missing = [key for key in all_keys() if f"`{key}`" not in readme]
    assert not missing, f"keys missing from README.md: {missing}"


def test_python_built_configs_are_validated_too():
    config = Config()
    config.train.clients_per_round = 500
    with pytest.raises(ConfigError, match="train.clients_per_round=500 exceeds"):
        resolve(config)
