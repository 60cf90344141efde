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
