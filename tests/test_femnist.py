"""FEMNIST from LEAF's JSON files, one client a writer (specs/fedcom.md §5.1-5.2), on generated files."""
import json

import numpy as np
import pytest

import rayfed
from rayfed.api import load_data
from rayfed.preflight import load_config
from rayfed.errors import ConfigError

WRITERS = {"f0001": (12, 3), "f0002": (7, 2), "f0003": (20, 5), "f0004": (9, 0), "f0005": (15, 4)}


def write_femnist(root, writers=WRITERS, seed=0):
    """LEAF's layout: femnist/{train,test}/*.json; labels 0-61, a third of them letters."""
    rng = np.random.default_rng(seed)
    for split, column in (("train", 0), ("test", 1)):
        folder = root / "femnist" / split
        folder.mkdir(parents=True, exist_ok=True)
        user_data, counts = {}, []
        for writer, sizes in writers.items():
            count = sizes[column]
            labels = rng.integers(0, 15, size=count)          # 0-9 digits, 10-14 letters
            user_data[writer] = {"x": rng.random((count, 784)).round(3).tolist(), "y": labels.tolist()}
            counts.append(count)
        data = {"users": list(writers), "num_samples": counts, "user_data": user_data}
        (folder / f"all_data_0_{split}.json").write_text(json.dumps(data))
    return root


def config(root, *extra):
    return load_config(None, ["data.dataset=femnist", f"data.root={root}", "data.num_clients=3",
                              "train.clients_per_round=2", "engine.backend=local", *extra])


def digits_of(root, split, writer):
    entry = json.loads((root / "femnist" / split / f"all_data_0_{split}.json").read_text())["user_data"][writer]
    labels = np.array(entry["y"], dtype=np.int64)
    return np.array(entry["x"], dtype=np.float32)[labels < 10], labels[labels < 10]


def test_clients_are_writers_kept_to_their_digits(tmp_path):
    root = write_femnist(tmp_path)
    dataset, partition = load_data(config(root))
    assert dataset.input_shape == (1, 28, 28) and dataset.num_classes == 10
    assert dataset.train_y.max() < 10 and dataset.test_y.max() < 10
    # every client's samples are exactly one eligible writer's digits (f0004 has no test samples)
    found = []
    for client in range(3):
        rows = partition.client(client)
        for writer in ("f0001", "f0002", "f0003", "f0005"):
            images, labels = digits_of(root, "train", writer)
            if len(labels) == len(rows) and np.array_equal(dataset.train_y[rows], labels) \
                    and np.array_equal(dataset.train_x[rows].reshape(len(rows), -1), images):
                found.append(writer)
    assert len(found) == 3 and len(set(found)) == 3
    test_sizes = sum(len(digits_of(root, "test", writer)[1]) for writer in found)
    assert len(dataset.test_y) == test_sizes
    again, _ = load_data(config(root))
    assert np.array_equal(again.train_y, dataset.train_y)
    other = {tuple(load_data(config(root, f"seed={seed}"))[0].train_y[:5]) for seed in range(6)}
    assert len(other) > 1                                          # the writers drawn depend on the seed


def test_iid_pools_the_writers_and_a_run_trains(tmp_path):
    root = write_femnist(tmp_path)
    dataset, partition = load_data(config(root, "data.partition=iid"))
    assert partition.num_clients == 3 and sum(partition.sizes) <= len(dataset.train_y)
    result = rayfed.run(config(root, "train.rounds=2", "train.eval_every=2", "model.name=relu_mlp",
                               "model.hidden_sizes=[16]", "train.batch_size=4"),
                        run_dir=tmp_path / "run", progress=False)
    assert np.isfinite(result.history[-1]["test_loss"])


@pytest.mark.parametrize("damage, message", [
    (lambda data: data["user_data"]["f0001"]["y"].__setitem__(0, 70), "label 70, outside LEAF's 0..61"),
    (lambda data: data["user_data"]["f0001"]["x"].__setitem__(0, [0.5] * 10), "not 784 numbers"),
    (lambda data: data["user_data"]["f0001"]["y"].__setitem__(0, "a"), r"a label \(y\) that is not an integer"),
    (lambda data: data["num_samples"].__setitem__(0, 99), "says user 'f0001' has 99 samples"),
    (lambda data: data["user_data"]["f0001"]["x"][0].__setitem__(3, 10**400),
     r"user 'f0001' has an image \(x\) with a number too large for a float"),
    (lambda data: data["user_data"]["f0001"]["y"].__setitem__(0, 10**400), r"a label \(y\) too large for an integer"),
])
def test_a_damaged_file_is_one_line_naming_it(tmp_path, damage, message):
    root = write_femnist(tmp_path)
    path = root / "femnist" / "train" / "all_data_0_train.json"
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message) as raised:
        load_data(config(root))
    assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)


def test_missing_files_too_many_clients_and_partitions_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="femnist files missing: .* holds no .json file; build LEAF's files"):
        config(tmp_path)
    root = write_femnist(tmp_path / "data")
    with pytest.raises(ConfigError, match="data.num_clients=5 exceeds the 4 FEMNIST writers with digits"):
        load_data(config(root, "data.num_clients=5"))
    with pytest.raises(ConfigError, match="data.partition=dirichlet does not apply to data.dataset=femnist"):
        config(root, "data.partition=dirichlet")
