"""What every registered algorithm declares is what a run does: its traffic per client, the state
classes its checkpoints hold, and the capabilities `rayfed algorithms` shows."""
import pytest

import rayfed
from rayfed.algorithms.base import build_algorithm
from rayfed.algorithms.describe import describe_algorithm
from rayfed.registry import ALGORITHMS

RUN = ["engine.backend=local", "data.num_clients=10", "train.clients_per_round=4", "train.rounds=2",
       "train.eval_every=2", "model.name=mlp", "model.hidden_sizes=[6]"]
EXTRA = {"gradma_s": ["algorithm.memory_size=4"], "gradma": ["algorithm.memory_size=4"]}


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_the_declared_traffic_is_what_a_round_sends(tmp_path, name):
    config = rayfed.load_config(None, RUN + [f"algorithm.name={name}", *EXTRA.get(name, [])])
    result = rayfed.run(config, run_dir=tmp_path / name, progress=False)
    algorithm = build_algorithm(config.algorithm)
    d, float_bytes = result.summary["num_params"], 4
    buffers = 2 * 6                       # BatchNorm's running mean and variance of the hidden layer
    second = result.history[1]            # STEM broadcasts its momentum from the second round on
    assert second["bytes_up"] == 4 * (algorithm.upload_size(d) + buffers) * float_bytes
    reply = second["bytes_down"] - 4 * (algorithm.download_size(d) + buffers) * float_bytes
    assert reply == (4 * d * float_bytes if algorithm.replies else 0)      # FedGATE's Delta_bar to each client


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_the_description_lists_every_parameter_and_state_class(name):
    described = describe_algorithm(name)
    cls = ALGORITHMS.get(name).target
    for key in cls.Params.model_fields:
        if key != "name" and (key != "lr_global" or cls.server_lr) and (key != "agg_weighting" or cls.weighted):
            assert f"\n  {key} " in described
    for state in cls.state_classes:
        assert state.__name__ in described


def test_a_config_yaml_written_before_per_algorithm_sections_still_loads(tmp_path):
    """Such files list every algorithm key, null where the algorithm does not take it: null is "not set"."""
    old = ("algorithm:\n  name: fedgate\n  lr_local: 0.05\n  lr_global: 1.0\n  beta1: null\n  mu: null\n"
           "  memory_size: null\n  alpha: 0.5\n  own_term: null\n  memory: null\n  client_replicas: null\n"
           "  agg_weighting: uniform\n")
    (tmp_path / "config.yaml").write_text(old)
    config = rayfed.load_config(tmp_path / "config.yaml")
    assert config.algorithm.model_dump() == {"name": "fedgate", "lr_local": 0.05, "lr_global": 1.0,
                                             "agg_weighting": "uniform", "alpha": 0.5, "client_replicas": False}
    (tmp_path / "config.yaml").write_text(old.replace("beta1: null", "beta1: 0.9"))
    with pytest.raises(rayfed.ConfigError, match="^algorithm.beta1 is not a parameter of fedgate"):
        rayfed.load_config(tmp_path / "config.yaml")
    (tmp_path / "config.yaml").write_text(old.replace("alpha: 0.5", "alpah: 0.5"))
    with pytest.raises(rayfed.ConfigError, match=r"^unknown key 'algorithm.alpah' \(did you mean 'algorithm.alpha'"):
        rayfed.load_config(tmp_path / "config.yaml")
