"""femnist_lazy: FEMNIST's writers read from memory-mapped files converted once from LEAF's JSON,
against femnist on the same generated files."""
import json
import os
import pickle

import numpy as np
import pytest
import torch

import rayfed
from rayfed.api import load_data
from rayfed.data import femnist, femnist_lazy
from rayfed.errors import ConfigError
from tests.test_engine_equivalence import ON_RAY
from tests.test_femnist import WRITERS, write_femnist

RUN = ["data.num_clients=3", "train.clients_per_round=2", "train.rounds=3", "model.hidden_sizes=[16]",
       "train.batch_size=4"]


def config(root, dataset="femnist_lazy", *extra):
    return rayfed.load_config(None, [f"data.dataset={dataset}", f"data.root={root}", *RUN, *extra])


def conversions(root):
    return sorted(path.name for path in (root / "femnist" / femnist_lazy.CACHE).iterdir())


@pytest.mark.slow
def test_runs_are_femnists_bits_on_both_engines(tmp_path, ray_cluster):
    root = write_femnist(tmp_path)
    eager = rayfed.run(config(root, "femnist", "engine.backend=local"), run_dir=tmp_path / "eager", progress=False)
    for name, engine in (("local", ["engine.backend=local"]), ("ray", ON_RAY)):
        lazy = rayfed.run(config(root, "femnist_lazy", *engine, "engine.num_workers=2"), run_dir=tmp_path / name,
                          progress=False)
        assert torch.equal(lazy.params, eager.params), name
        assert [m["test_accuracy"] for m in lazy.history if "test_accuracy" in m] == \
            [m["test_accuracy"] for m in eager.history if "test_accuracy" in m]


def test_clients_are_femnists_writers_and_only_their_rows_travel(tmp_path):
    root = write_femnist(tmp_path)
    for seed in range(4):
        eager, partition = load_data(config(root, "femnist", f"seed={seed}"))
        lazy, sizes = load_data(config(root, "femnist_lazy", f"seed={seed}"))
        assert np.array_equal(sizes.sizes, partition.sizes)
        for client in range(3):
            inputs, labels = lazy.source.client(client)
            rows = partition.client(client)
            assert np.array_equal(inputs, eager.train_x[rows]) and np.array_equal(labels, eager.train_y[rows])
            assert inputs.dtype == np.float32 and labels.dtype == np.int64
        assert np.array_equal(lazy.test_x, eager.test_x) and np.array_equal(lazy.test_y, eager.test_y)
    # The workers receive two paths and the row lists, not the images.
    assert len(pickle.dumps(lazy.source)) < 1000 + 8 * sum(sizes.sizes) < eager.train_x.nbytes


def test_the_json_is_converted_once_and_again_when_a_file_changes(tmp_path, monkeypatch):
    root = write_femnist(tmp_path)
    first, _ = load_data(config(root))
    assert len(conversions(root)) == 1

    def parse(folder):
        raise AssertionError(f"parsed {folder} again")
    with monkeypatch.context() as patched:
        patched.setattr(femnist, "read_split", parse)
        again, _ = load_data(config(root))
    assert np.array_equal(again.test_x, first.test_x) and np.array_equal(again.source.client(0)[1],
                                                                          first.source.client(0)[1])
    changed = {**WRITERS, "f0001": (14, 3)}
    write_femnist(root, changed, seed=5)
    renewed, sizes = load_data(config(root))
    assert len(conversions(root)) == 2
    eager, partition = load_data(config(root, "femnist"))
    assert np.array_equal(sizes.sizes, partition.sizes) and np.array_equal(renewed.test_x, eager.test_x)


@pytest.mark.parametrize("damage", ["truncate", "offsets", "delete"])
def test_a_damaged_conversion_is_made_again(tmp_path, damage):
    root = write_femnist(tmp_path)
    fresh, _ = load_data(config(root))
    folder = femnist_lazy.cache_folder(str(root))
    if damage == "truncate":
        path = folder / "train_x.npy"
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "offsets":
        index = json.loads((folder / femnist_lazy.INDEX).read_text())
        index["index"]["offsets"]["train"][1] += 1          # still bounds the arrays: only the digest tells
        (folder / femnist_lazy.INDEX).write_text(json.dumps(index))
    else:
        os.remove(folder / "test_y.npy")
    rebuilt, _ = load_data(config(root))
    assert conversions(root) == [folder.name]
    for client in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(rebuilt.source.client(client), fresh.source.client(client)))
    assert np.array_equal(rebuilt.test_x, fresh.test_x)


def test_an_unwritable_cache_too_many_clients_and_missing_files_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="femnist files missing: .* holds no .json file; build LEAF's files"):
        config(tmp_path)
    root = write_femnist(tmp_path / "data")
    with pytest.raises(ConfigError, match="data.num_clients=5 exceeds the 4 FEMNIST writers with digits"):
        load_data(config(root, "femnist_lazy", "data.num_clients=5"))
    with pytest.raises(ConfigError, match="data.partition=iid does not apply to data.dataset=femnist_lazy"):
        config(root, "femnist_lazy", "data.partition=iid")
    fresh = write_femnist(tmp_path / "fresh")
    (fresh / "femnist" / femnist_lazy.CACHE).write_text("a file where the conversions go")
    with pytest.raises(ConfigError) as raised:
        load_data(config(fresh))
    message = str(raised.value)
    assert message.startswith(f"data.dataset=femnist_lazy keeps its converted arrays under "
                              f"{fresh / 'femnist' / femnist_lazy.CACHE}, which it cannot write (")
    assert message.endswith("); use data.dataset=femnist, which reads the JSON files each run")
    assert "\n" not in message
