"""LEAF's Shakespeare: reading its JSON files, the natural and iid clients, every malformed file
ending in one line, the char-LSTM, and short runs on generated files."""
import json
import pathlib

import numpy as np
import pytest
import torch

import rayfed
from rayfed.cli import main
from rayfed.preflight import load_config
from rayfed.data import load_dataset, make_partition, missing_files
from rayfed.data import leaf as leaf_json, shakespeare
from rayfed.data.shakespeare import NUM_CHARACTERS, SEQUENCE_LENGTH, VOCABULARY, encode, read_split
from rayfed.errors import ConfigError
from rayfed.models import FlatModel, build_model
from rayfed.resources import estimate_memory, meta_model

# (training, test) samples per role. With crops of 10 and 5, roles a, b, c and e are eligible:
# d has too few test samples, f too few training samples, and g has no test samples at all.
ROLE_SIZES = {"a": (30, 10), "b": (25, 10), "c": (10, 5), "d": (40, 3), "e": (30, 12), "f": (8, 10), "g": (30, 0)}
ELIGIBLE = ["a", "b", "c", "e"]
TRAIN_CROP, TEST_CROP = 10, 5
BASE = ["data.dataset=shakespeare", "data.num_clients=3", f"data.shakespeare_train_samples={TRAIN_CROP}",
        f"data.shakespeare_test_samples={TEST_CROP}", "train.clients_per_round=2"]


def windows(rng: np.random.Generator, count: int) -> dict[str, list[str]]:
    """LEAF's samples of one role: each 80-character window of its text and the character after it."""
    text = "".join(rng.choice(list(VOCABULARY), count + SEQUENCE_LENGTH))
    return {"x": [text[i:i + SEQUENCE_LENGTH] for i in range(count)],
            "y": [text[i + SEQUENCE_LENGTH] for i in range(count)]}


def leaf_file(user_data: dict[str, dict]) -> dict:
    return {"users": list(user_data), "num_samples": [len(data["y"]) for data in user_data.values()],
            "user_data": user_data}


def write_leaf(root: pathlib.Path, seed: int = 0) -> dict[str, dict[str, dict]]:
    """ROLE_SIZES as LEAF writes them, each split over two files; returns {split: {role: samples}}."""
    rng = np.random.default_rng(seed)
    roles = {split: {} for split in leaf_json.SPLITS}
    for role, sizes in ROLE_SIZES.items():
        for split, count in zip(leaf_json.SPLITS, sizes):
            if count:
                roles[split][role] = windows(rng, count)
    for split, folder in shakespeare.folders(str(root)).items():
        folder.mkdir(parents=True)
        users = list(roles[split])
        for part, chosen in enumerate((users[:3], users[3:])):
            (folder / f"all_data_{part}_{split}.json").write_text(
                json.dumps(leaf_file({user: roles[split][user] for user in chosen})))
    return roles


@pytest.fixture
def leaf(tmp_path):
    return tmp_path, write_leaf(tmp_path)


def tokens_of(samples: dict) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([encode(x) for x in samples["x"]], dtype=np.int64),
            np.array([encode(y)[0] for y in samples["y"]], dtype=np.int64))


def crop_origin(block_x: np.ndarray, block_y: np.ndarray, roles: dict[str, dict]) -> tuple[str, int]:
    """The role and start of which (block_x, block_y) is the contiguous crop; fails if none."""
    size = len(block_y)
    for role, samples in roles.items():
        x, y = tokens_of(samples)
        for start in range(len(y) - size + 1):
            if np.array_equal(x[start:start + size], block_x) and np.array_equal(y[start:start + size], block_y):
                return role, start
    raise AssertionError("not a contiguous crop of any role")


def load(root, **overrides):
    arguments = {"seed": 0, "num_clients": 3, "partition": "natural", "shakespeare_train_samples": TRAIN_CROP,
                 "shakespeare_test_samples": TEST_CROP, **overrides}
    return load_dataset("shakespeare", root=str(root), **arguments)


def test_vocabulary_is_leafs_80_characters_and_tokens_round_trip():
    assert len(VOCABULARY) == len(set(VOCABULARY)) == NUM_CHARACTERS == 80
    np.testing.assert_array_equal(encode(VOCABULARY), np.arange(80))
    text = "ROMEO. But soft, what light through yonder window breaks?\n"
    assert "".join(VOCABULARY[token] for token in encode(text)) == text
    assert list(encode("a<é\ud800{")) == [VOCABULARY.index("a"), -1, -1, -1, -1]


def test_a_split_is_read_from_all_its_files(leaf):
    root, roles = leaf
    train = read_split(shakespeare.folders(str(root))["train"])
    assert sorted(train) == sorted(roles["train"])
    x, y = train["d"]
    assert x.shape == (40, SEQUENCE_LENGTH) and y.shape == (40,)
    assert "".join(VOCABULARY[token] for token in x[7]) == roles["train"]["d"]["x"][7]
    assert VOCABULARY[y[39]] == roles["train"]["d"]["y"][39]


def test_natural_clients_are_contiguous_crops_of_distinct_eligible_roles(leaf):
    root, roles = leaf
    dataset = load(root)
    assert (dataset.name, dataset.input_shape, dataset.num_classes) == ("shakespeare", (80,), 80)
    assert dataset.train_x.dtype == dataset.train_y.dtype == dataset.test_x.dtype == np.int64
    assert dataset.train_x.shape == (3 * TRAIN_CROP, 80) and dataset.test_x.shape == (3 * TEST_CROP, 80)
    partition = make_partition("natural", dataset.train_y, 80, 3, seed=0, natural=dataset.natural_partition)
    assert list(partition.sizes) == [TRAIN_CROP] * 3
    chosen = []
    for client in range(3):
        rows = partition.client(client)
        role, _ = crop_origin(dataset.train_x[rows], dataset.train_y[rows], roles["train"])
        test_rows = slice(client * TEST_CROP, (client + 1) * TEST_CROP)
        # The test set is the union of the clients' test crops, each from the client's own role.
        assert crop_origin(dataset.test_x[test_rows], dataset.test_y[test_rows], roles["test"])[0] == role
        chosen.append(role)
    assert len(set(chosen)) == 3 and set(chosen) <= set(ELIGIBLE)


def test_iid_clients_are_drawn_from_the_pool_of_all_roles(leaf):
    root, roles = leaf
    dataset = load(root, partition="iid", num_clients=4)
    assert dataset.natural_partition is None
    assert dataset.train_x.shape == (4 * TRAIN_CROP, 80) and dataset.test_x.shape == (4 * TEST_CROP, 80)
    owner = {tuple(row): role for role, samples in roles["train"].items() for row in tokens_of(samples)[0]}
    assert len({tuple(row) for row in dataset.train_x}) == 4 * TRAIN_CROP      # no sample twice
    partition = make_partition("iid", dataset.train_y, 80, 4, seed=0)
    assert list(partition.sizes) == [TRAIN_CROP] * 4
    for client in range(4):
        assert len({owner[tuple(row)] for row in dataset.train_x[partition.client(client)]}) > 1
    test_rows = {tuple(row) for samples in roles["test"].values() for row in tokens_of(samples)[0]}
    assert all(tuple(row) in test_rows for row in dataset.test_x)


@pytest.mark.parametrize("partition", ["natural", "iid"])
def test_the_clients_follow_the_seed(leaf, partition):
    root, _ = leaf
    first, again, other = (load(root, partition=partition, seed=seed) for seed in (5, 5, 6))
    np.testing.assert_array_equal(first.train_x, again.train_x)
    np.testing.assert_array_equal(first.test_y, again.test_y)
    assert not np.array_equal(first.train_x, other.train_x)


def test_too_few_eligible_roles_is_one_line(leaf):
    root, _ = leaf
    with pytest.raises(ConfigError, match=r"^data.num_clients=5 exceeds the 4 of the 7 shakespeare roles that have "
                                          r"at least data.shakespeare_train_samples=10 training and "
                                          r"data.shakespeare_test_samples=5 test samples; lower one of them$"):
        load(root, num_clients=5)
    total = sum(train for train, _ in ROLE_SIZES.values())
    with pytest.raises(ConfigError, match=f"data.partition=iid: data.num_clients=100 clients of "
                                          f"data.shakespeare_train_samples=10 samples need 1000, but all shakespeare "
                                          f"roles together have {total}"):
        load(root, partition="iid", num_clients=100)


def set_in(path, value):
    def change(data):
        *parents, last = path
        for key in parents:
            data = data[key]
        data[last] = value
    return change


def delete(*path):
    def change(data):
        *parents, last = path
        for key in parents:
            data = data[key]
        del data[last]
    return change


def first_x(transform):
    return lambda data: set_in(("user_data", "a", "x", 3), transform(data["user_data"]["a"]["x"][3]))(data)


MALFORMED = {
    "not JSON": (b"{'users': ", "is not JSON"),
    "not UTF-8": (b'{"users": ["\xff"]}', "is not JSON"),
    "an array": (b"[1, 2]", "holds a JSON array, not LEAF's object of users, num_samples and user_data"),
    "no user_data": (delete("user_data"), "has no 'user_data' entry"),
    "users not names": (set_in(("users",), "abc"), "has a 'users' entry that is not an array of names"),
    "num_samples not integers": (set_in(("num_samples", 0), 3.5), "'num_samples' entry that is not an array of int"),
    "num_samples short": (lambda data: data["num_samples"].pop(), "lists 3 users but 2 num_samples"),
    "num_samples wrong": (set_in(("num_samples", 0), 31), "says user 'a' has 31 samples (num_samples), but its "
                                                          "data holds 30"),
    "user twice": (lambda data: data["users"].append("a") or data["num_samples"].append(30),
                   "lists user 'a' twice in 'users'"),
    "user without data": (delete("user_data", "b"), "has no user_data for user 'b'"),
    "data without user": (set_in(("user_data", "zz"), {"x": [], "y": []}), "has user_data for user 'zz', who is not"),
    "no y": (delete("user_data", "a", "y"), "user 'a' has no 'x' and 'y' arrays in user_data"),
    "x and y differ": (lambda data: data["user_data"]["a"]["y"].pop(), "user 'a' has 30 inputs (x) but 29 targets"),
    "short x": (first_x(lambda x: x[:79]), "user 'a': x[3] is 79 characters long, not 80"),
    "long x": (first_x(lambda x: x + "a"), "user 'a': x[3] is 81 characters long, not 80"),
    "x not a string": (first_x(lambda x: 17), "user 'a': x[3] is a JSON number, not a string"),
    "two-character y": (set_in(("user_data", "a", "y", 2), "ab"), "user 'a': y[2] is 2 characters long, not 1"),
    "character outside the vocabulary": (first_x(lambda x: x[:5] + "<" + x[6:]),
                                         "user 'a': x[3] holds '<', which is not one of LEAF's 80 characters"),
}


@pytest.mark.parametrize("damage, expected", MALFORMED.values(), ids=MALFORMED)
def test_a_malformed_file_is_one_line_naming_it(leaf, damage, expected):
    root, _ = leaf
    path = shakespeare.folders(str(root))["train"] / "all_data_0_train.json"
    if isinstance(damage, bytes):
        path.write_bytes(damage)
    else:
        data = json.loads(path.read_text())
        damage(data)
        path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as raised:
        load(root)
    message = str(raised.value)
    assert message.startswith(f"{path} ") and expected in message, message
    assert "\n" not in message and "preprocess.sh" in message


def test_a_role_in_two_files_and_a_file_too_big_are_refused(leaf, monkeypatch):
    root, roles = leaf
    folder = shakespeare.folders(str(root))["train"]
    (folder / "extra.json").write_text(json.dumps(leaf_file({"b": roles["train"]["b"]})))
    with pytest.raises(ConfigError, match=f"^{folder / 'extra.json'} holds user 'b', whom "
                                          f"{folder / 'all_data_0_train.json'} holds too"):
        load(root)
    monkeypatch.setattr(leaf_json, "MAX_FILE_BYTES", 100)
    with pytest.raises(ConfigError, match="all_data_0_train.json is .* bytes, more than LEAF's largest file"):
        load(root)


def test_missing_files_say_where_leafs_files_go_and_how_to_make_them(tmp_path):
    train, test = shakespeare.folders(str(tmp_path)).values()
    for call in (lambda: missing_files("shakespeare", str(tmp_path)), lambda: load(tmp_path),
                 lambda: load_config(None, BASE + [f"data.root={tmp_path}"])):
        with pytest.raises(ConfigError) as raised:
            call()
        message = str(raised.value)
        assert message.startswith(f"shakespeare files missing: {train} holds no .json file; ")
        assert "LEAF's files with its data/shakespeare/preprocess.sh" in message and shakespeare.LEAF_COMMAND in message
        assert f"data/train/*.json into {train} and data/test/*.json into {test}" in message

    train.mkdir(parents=True)
    (train / "all_data_train.json").write_text(json.dumps(leaf_file({})))
    assert str(test) in str(pytest.raises(ConfigError, missing_files, "shakespeare", str(tmp_path)).value)
    with pytest.raises(ConfigError, match=r"^data.download=true cannot fetch shakespeare, which LEAF builds .*"
                                          r"\(.*/test holds no .json file\)"):
        load(tmp_path, download=True)


def test_config_resolves_the_natural_split_and_the_char_lstm(leaf):
    root, _ = leaf
    config = load_config(None, BASE + [f"data.root={root}"])
    assert (config.data.partition, config.model.name) == ("natural", "char_lstm")
    assert load_config(None, BASE + [f"data.root={root}", "data.partition=iid"]).data.partition == "iid"
    with pytest.raises(ConfigError, match="data.partition=dirichlet does not apply to data.dataset=shakespeare"):
        load_config(None, BASE + [f"data.root={root}", "data.partition=dirichlet"])
    with pytest.raises(ConfigError, match=r"data.augment=true crops and flips images; data.dataset=shakespeare"):
        load_config(None, BASE + [f"data.root={root}", "data.augment=true"])
    with pytest.raises(ConfigError, match=r"^model.name=mlp does not fit data.dataset=shakespeare \(int64 token "
                                          r"inputs of shape \(80,\)\): .*; use one of: char_lstm$"):
        load_config(None, BASE + [f"data.root={root}", "model.name=mlp"])


def test_memory_estimate_counts_int64_tokens():
    config = load_config(None, BASE + ["data.download=true", "engine.backend=local"])
    model = meta_model("char_lstm", "shakespeare", (200, 100))
    assert estimate_memory(config, model)["data"] == 3 * (TRAIN_CROP + TEST_CROP) * (80 * 8 + 8)


def test_char_lstm_is_feddyns_model():
    model = build_model("char_lstm", (80,), 80)
    lstm_layer = lambda inputs: 4 * 100 * (inputs + 100) + 2 * 4 * 100    # four gates, two bias vectors
    expected = 80 * 8 + lstm_layer(8) + lstm_layer(100) + 100 * 80 + 80
    assert FlatModel(model).num_params == expected == 133_520
    assert model(torch.randint(0, 80, (4, 80))).shape == (4, 80)
    with pytest.raises(ConfigError, match="model.name=char_lstm needs sequences of character tokens"):
        build_model("char_lstm", (1, 28, 28), 10)


RUN = ["train.rounds=2", "train.local_steps=2", "train.batch_size=4",
       "engine.backend=local", "algorithm.name=fedavg", "algorithm.lr_local=0.5"]


@pytest.mark.parametrize("partition", ["natural", "iid"])
def test_a_short_run_trains_on_the_generated_files(leaf, tmp_path, partition):
    root, _ = leaf
    config = rayfed.load_config(None, BASE + RUN + [f"data.root={root}", f"data.partition={partition}"])
    result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    assert len(result.history) == 2 and np.isfinite(result.history[-1]["test_loss"])
    assert result.summary["num_params"] == 133_520


# torch.func.vmap has no batching rule for the LSTM kernel and loops over the clients instead, saying so.
@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_vectorized_clients_train_as_sequential_ones_do(leaf, tmp_path):
    root, _ = leaf
    overrides = BASE + RUN + [f"data.root={root}"]
    sequential = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "one", progress=False)
    vectorized = rayfed.run(rayfed.load_config(None, overrides + ["engine.vectorize=true"]), run_dir=tmp_path / "all",
                            progress=False)
    assert vectorized.summary["vectorized"]
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=1e-4, atol=1e-5)


def test_cli_reports_a_malformed_file_in_one_line(leaf, tmp_path, capsys, monkeypatch):
    root, _ = leaf
    monkeypatch.chdir(tmp_path)
    path = shakespeare.folders(str(root))["test"] / "all_data_1_test.json"
    path.write_text('{"users": ["e"], "num_samples": [1], "user_data": {"e": {"x": ["short"], "y": ["a"]}}}')
    assert main(["run", *BASE, *RUN, f"data.root={root}", "--out", "out"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"rayfed: error: {path} user 'e': x[0] is 5 characters long")
    assert not (tmp_path / "out").exists()
