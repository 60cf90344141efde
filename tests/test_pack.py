"""rayfed.engine.pack: runs packed into one batched computation equal the runs alone (within
engine.vectorize's tolerance), give the same bits every time, and keep their own run directories."""
import pytest
import torch

import rayfed
from rayfed.engine.pack import Pack
from rayfed.metrics import read_summary
from tests.test_engine_equivalence import assert_same_run
from tests.test_vectorize import ATOL, BN_ATOL, BN_RTOL, RTOL, SMALL

POINTS = [["algorithm.lr_local=0.05", "seed=0"], ["algorithm.lr_local=0.1", "seed=0"],
          ["algorithm.lr_local=0.05", "seed=1"]]
ROUNDS, STEPS, CLIENTS = 4, 3, 9          # SMALL's train.rounds, local_steps and clients_per_round


def packed(tmp_path, configs, name):
    pack = Pack()
    outcomes = pack.run([lambda config=config, index=index: rayfed.run(config, run_dir=tmp_path / f"{name}{index}",
                                                                        progress=False)
                         for index, config in enumerate(configs)])
    return pack, outcomes


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_packed_runs_equal_the_runs_alone_and_repeat_bitwise(tmp_path, algorithm):
    configs = [rayfed.load_config(None, SMALL + ["engine.vectorize=true", f"algorithm.name={algorithm}"] + point)
               for point in POINTS]
    alone = [rayfed.run(config, run_dir=tmp_path / f"alone{index}", progress=False)
             for index, config in enumerate(configs)]
    pack, first = packed(tmp_path, configs, "first")
    # Every local step's pass took the clients of all three runs at once.
    assert pack.passes == ROUNDS * STEPS and set(pack.rows_per_pass) == {len(POINTS) * CLIENTS}
    _, second = packed(tmp_path, configs, "second")
    for index, (run_alone, run_packed, again) in enumerate(zip(alone, first, second)):
        torch.testing.assert_close(run_packed.params, run_alone.params, rtol=RTOL, atol=ATOL)
        assert_same_run(run_packed, again)
        assert read_summary(tmp_path / f"first{index}")["rounds_completed"] == ROUNDS


def test_a_failing_run_leaves_the_others_to_finish(tmp_path):
    config = rayfed.load_config(None, SMALL + ["engine.vectorize=true"])

    def fails():
        raise ValueError("no data")

    _, outcomes = packed(tmp_path, [config], "ok")
    pack = Pack()
    mixed = pack.run([fails, lambda: rayfed.run(config, run_dir=tmp_path / "next", progress=False)])
    assert isinstance(mixed[0], ValueError) and str(mixed[0]) == "no data"
    assert torch.equal(mixed[1].params, outcomes[0].params)


def test_sweep_trials_pack_where_only_seeds_and_floats_differ():
    from rayfed.sweep.pack import packs
    from rayfed.sweep.spec import Trial

    def trial(name, overrides):
        return Trial(name, (), tuple(overrides), rayfed.load_config(None, overrides))

    batched = ["engine.vectorize=true", "engine.backend=local"]
    trials = [trial("a", batched + ["algorithm.lr_local=0.1"]),
              trial("b", batched + ["algorithm.lr_local=0.2", "seed=3"]),
              trial("c", batched + ["train.rounds=7"]), trial("d", ["engine.backend=local", "algorithm.lr_local=0.3"]),
              trial("e", batched + ["algorithm.lr_local=0.3"]), trial("f", batched + ["train.rounds=7", "seed=2"]),
              trial("g", batched + ["algorithm.name=fedprox"])]

    def names(limit):
        return [[t.name for t in pack] for pack in packs(trials, limit)]

    assert names(5) == [["a", "b", "e"], ["c", "f"], ["d"], ["g"]]
    assert names(2) == [["a", "b"], ["c", "f"], ["d"], ["e"], ["g"]]
    assert names(1) == [[name] for name in "abcdefg"]


def test_full_gradient_chunks_of_different_lengths_stack_only_with_their_like(tmp_path):
    """MimeLite's full gradients take each client's samples in one chunk as long as the run's largest client
    (digits split by Dirichlet 0.3: clients of very different sizes), so runs give chunks of different lengths.
    Those pass separately, no run's rows padded to another's; through BatchNorm, whose statistics padding
    rows would move if they were not copies of the client's own rows (vectorized._padded_rows)."""
    configs = [rayfed.load_config(None, SMALL + ["engine.vectorize=true", "algorithm.name=mimelite",
                                                 "data.dataset=digits", "data.partition=dirichlet", "data.alpha=0.3",
                                                 "model.name=mlp", "model.hidden_sizes=[16]"] + point)
               for point in POINTS]
    alone = [rayfed.run(config, run_dir=tmp_path / f"alone{index}", progress=False)
             for index, config in enumerate(configs)]
    pack, packed_runs = packed(tmp_path, configs, "packed")
    assert len(set(pack.rows_per_pass)) > 1 and max(pack.rows_per_pass) == len(POINTS) * CLIENTS
    for run_alone, run_packed in zip(alone, packed_runs):
        torch.testing.assert_close(run_packed.params, run_alone.params, rtol=BN_RTOL, atol=BN_ATOL)
