"""LEAF's Shakespeare (Caldas et al., arXiv:1812.01097; FedLALR, arXiv:2309.09719, Sec. V-C): predict the next character of an 80-character window
of a speaking role's lines. Read from the JSON files LEAF's preprocess.sh writes, and cut into
clients as FedDyn's code does: a random crop of each of some randomly chosen roles (natural), or
of the pooled samples of all roles (iid)."""
from __future__ import annotations

import pathlib

import numpy as np
import torch

from rayfed.data import leaf
from rayfed.data.base import Dataset, register_dataset
from rayfed.data.partition import Partition
from rayfed.errors import ConfigError
from rayfed.seeding import Purpose, numpy_rng

# LEAF's ALL_LETTERS (models/utils/language_utils.py), which FedDyn's code uses too: a character's
# token is its position here.
VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
NUM_CHARACTERS = len(VOCABULARY)
SEQUENCE_LENGTH = 80
FOLDER = "shakespeare"          # under data.root, one subfolder per split
LEAF_COMMAND = "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample -tf 0.8"
_REBUILD = "rebuild it with LEAF's data/shakespeare/preprocess.sh"

# Every character of VOCABULARY is ASCII, so code points from 128 on are outside it too.
_TOKEN_OF_CODE = np.full(128, -1, dtype=np.int16)
_TOKEN_OF_CODE[[ord(character) for character in VOCABULARY]] = np.arange(NUM_CHARACTERS)

Samples = tuple[np.ndarray, np.ndarray]      # (n, SEQUENCE_LENGTH) tokens and their (n,) next characters


def folders(root: str) -> dict[str, pathlib.Path]:
    return leaf.split_folders(root, FOLDER)


def required_files(root: str) -> list[pathlib.Path]:
    """The folders of LEAF's .json files, one per split."""
    return list(folders(root).values())


def check_files(root: str, download: bool = False) -> None:
    leaf.check_files(root, FOLDER, f"the full data set: {LEAF_COMMAND}", "Project Gutenberg's text", download)


def encode(text: str) -> np.ndarray:
    """The token of each character of `text` (int16), -1 for one outside VOCABULARY."""
    # surrogatepass: JSON may hold a lone surrogate escape, which is then reported like any stray character.
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return np.where(codes < len(_TOKEN_OF_CODE), _TOKEN_OF_CODE[np.minimum(codes, len(_TOKEN_OF_CODE) - 1)], -1)


def load_clients(root: str, *, seed: int, num_clients: int, iid: bool, train_samples: int,
                 test_samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Partition | None]:
    """(train_x, train_y, test_x, test_y, natural partition) as int64 arrays. Natural: client i is
    the i-th of `num_clients` roles drawn among those with at least `train_samples` training and
    `test_samples` test samples, and keeps a contiguous random crop of that many of each; the test
    set is the union of the test crops. IID: every role's samples pooled, and `num_clients` times
    as many drawn at random from the pool, for make_partition's iid split to deal out."""
    train, test = (read_split(folder) for folder in folders(root).values())
    rng = numpy_rng(seed, Purpose.SHAKESPEARE_CLIENTS)
    if iid:
        train_x, train_y = _pooled(train, num_clients, train_samples, "data.shakespeare_train_samples", rng)
        test_x, test_y = _pooled(test, num_clients, test_samples, "data.shakespeare_test_samples", rng)
        return train_x, train_y, test_x, test_y, None
    roles = _chosen_roles(train, test, num_clients, train_samples, test_samples, rng)
    train_x, train_y = _concatenate([_crop(train[role], train_samples, rng) for role in roles])
    test_x, test_y = _concatenate([_crop(test[role], test_samples, rng) for role in roles])
    offsets = np.arange(num_clients + 1, dtype=np.int64) * train_samples
    return train_x, train_y, test_x, test_y, Partition(np.arange(len(train_y), dtype=np.int64), offsets)


def _chosen_roles(train: dict[str, Samples], test: dict[str, Samples], num_clients: int, train_samples: int,
                  test_samples: int, rng: np.random.Generator) -> list[str]:
    eligible = [role for role in sorted(train) if len(train[role][1]) >= train_samples
                and role in test and len(test[role][1]) >= test_samples]
    if len(eligible) < num_clients:
        raise ConfigError(f"data.num_clients={num_clients} exceeds the {len(eligible)} of the {len(train)} shakespeare "
                          f"roles that have at least data.shakespeare_train_samples={train_samples} training and "
                          f"data.shakespeare_test_samples={test_samples} test samples; lower one of them")
    return [eligible[index] for index in rng.choice(len(eligible), size=num_clients, replace=False)]


def _crop(samples: Samples, size: int, rng: np.random.Generator) -> Samples:
    tokens, targets = samples
    start = int(rng.integers(len(targets) - size + 1))
    return tokens[start:start + size], targets[start:start + size]


def _pooled(roles: dict[str, Samples], num_clients: int, per_client: int, key: str,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`num_clients * per_client` samples drawn without replacement from all roles' together: what
    LEAF's iid pooling, shuffling and re-splitting followed by a contiguous crop per client gives."""
    tokens, targets = _concatenate([roles[role] for role in sorted(roles)])
    needed = num_clients * per_client
    if needed > len(targets):
        raise ConfigError(f"data.partition=iid: data.num_clients={num_clients} clients of {key}={per_client} samples "
                          f"need {needed}, but all shakespeare roles together have {len(targets)}; "
                          f"lower one of them")
    picked = rng.choice(len(targets), size=needed, replace=False)
    return tokens[picked], targets[picked]


def _concatenate(parts: list[Samples]) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([tokens for tokens, _ in parts]).astype(np.int64),
            np.concatenate([targets for _, targets in parts]).astype(np.int64))


def read_split(folder: pathlib.Path) -> dict[str, Samples]:
    """Every role's samples in the folder's .json files, as uint8 tokens; a role is in one file only."""
    return leaf.read_split(folder, _user_samples, _REBUILD)


def _user_samples(path: pathlib.Path, user: str, entry, count: int) -> Samples:
    inputs, targets = leaf.user_arrays(path, user, entry, count, _REBUILD)
    tokens = _tokens(path, user, "x", inputs, SEQUENCE_LENGTH)
    return tokens, _tokens(path, user, "y", targets, 1).reshape(-1)


def _tokens(path: pathlib.Path, user: str, key: str, texts: list, length: int) -> np.ndarray:
    """(len(texts), length) uint8 tokens of texts that must each be `length` characters of VOCABULARY."""
    try:
        joined = "".join(texts)
    except TypeError:
        index, text = next((index, text) for index, text in enumerate(texts) if not isinstance(text, str))
        raise _bad_file(path, f"user {user!r}: {key}[{index}] is a JSON {leaf.json_type(text)}, not a string") from None
    # With every text at least `length` long and `length` on average, every one is exactly that long.
    if len(joined) != length * len(texts) or min(map(len, texts), default=length) != length:
        index, text = next((index, text) for index, text in enumerate(texts) if len(text) != length)
        raise _bad_file(path, f"user {user!r}: {key}[{index}] is {len(text)} characters long, not {length}")
    tokens = encode(joined)
    unknown = np.flatnonzero(tokens < 0)
    if unknown.size:
        position = int(unknown[0])
        raise _bad_file(path, f"user {user!r}: {key}[{position // length}] holds {joined[position]!r}, "
                              f"which is not one of LEAF's {NUM_CHARACTERS} characters")
    return tokens.astype(np.uint8).reshape(len(texts), length)


def _bad_file(path: pathlib.Path, problem: str) -> ConfigError:
    return leaf.bad_file(path, problem, _REBUILD)


def _missing(root: str) -> list[pathlib.Path]:
    """LEAF's files are beyond data.download's reach: their absence is the line saying how to make them."""
    check_files(root)
    return []


@register_dataset("shakespeare", input_shape=(SEQUENCE_LENGTH,), num_classes=NUM_CHARACTERS, default_model="char_lstm",
                  input_dtype=torch.int64, natural=True, partitions=("natural", "iid"),
                  required_files=required_files, missing_files=_missing,
                  num_samples=lambda data: data.num_clients * (data.shakespeare_train_samples
                                                               + data.shakespeare_test_samples))
def _shakespeare(data, seed: int) -> Dataset:
    """LEAF's Shakespeare (Caldas et al., 2018): next-character prediction, one client per speaking role."""
    check_files(data.root, data.download)
    *arrays, natural = load_clients(data.root, seed=seed, num_clients=data.num_clients, iid=data.partition == "iid",
                                    train_samples=data.shakespeare_train_samples,
                                    test_samples=data.shakespeare_test_samples)
    return Dataset("shakespeare", *arrays, num_classes=NUM_CHARACTERS, input_shape=(SEQUENCE_LENGTH,),
                   natural_partition=natural)
