"""LEAF's JSON files (Shakespeare, FEMNIST): {"users": [...], "num_samples": [...], "user_data":
{user: {"x": [...], "y": [...]}}}, checked entry by entry so that a damaged file is one line naming
it, the user and the problem. Each dataset decodes its users' samples itself."""
from __future__ import annotations

import collections
import json
import pathlib
from typing import Any, Callable

from rayfed.errors import ConfigError

# LEAF's largest file (Shakespeare's full-size training file) is about 0.3 GB.
MAX_FILE_BYTES = 2**30
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}

# decode(path, user, user_data entry, num_samples) -> that user's samples
Decoder = Callable[[pathlib.Path, str, Any, int], Any]


SPLITS = ("train", "test")


def split_folders(root: str, dataset: str) -> dict[str, pathlib.Path]:
    """Where LEAF's files of `dataset` go: one folder per split under data.root."""
    return {split: pathlib.Path(root) / dataset / split for split in SPLITS}


def check_files(root: str, dataset: str, build: str, source: str, download: bool = False) -> None:
    """A ConfigError saying where LEAF's files go and how to make them (`build`: LEAF's command),
    unless both split folders hold some; `source`: what LEAF builds them from, for data.download."""
    folders = split_folders(root, dataset)
    empty = [folder for folder in folders.values() if not json_files(folder)]
    if not empty:
        return
    remedy = (f"build LEAF's files with its data/{dataset}/preprocess.sh ({build}) and copy its data/train/*.json "
              f"into {folders['train']} and data/test/*.json into {folders['test']}")
    if download:
        raise one_line(f"data.download=true cannot fetch {dataset}, which LEAF builds from {source} "
                       f"({empty[0]} holds no .json file); {remedy}")
    raise one_line(f"{dataset} files missing: {empty[0]} holds no .json file; {remedy}")


def json_files(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path for path in folder.glob("*.json") if path.is_file())


def read_split(folder: pathlib.Path, decode: Decoder, rebuild: str) -> dict[str, Any]:
    """Every user's samples in the folder's .json files; a user is in one file only. `rebuild` says
    how to make the files again, for the error lines."""
    users: dict[str, Any] = {}
    file_of: dict[str, pathlib.Path] = {}
    for path in json_files(folder):
        names, counts, user_data = _entries(path, _parse(path, rebuild), rebuild)
        for user, count in zip(names, counts):
            if user in users:
                raise bad_file(path, f"holds user {user!r}, whom {file_of[user]} holds too", rebuild)
            users[user], file_of[user] = decode(path, user, user_data[user], count), path
    return users


def user_arrays(path: pathlib.Path, user: str, entry, count: int, rebuild: str) -> tuple[list, list]:
    """A user's x and y arrays, checked against each other and against num_samples."""
    if not (isinstance(entry, dict) and isinstance(entry.get("x"), list) and isinstance(entry.get("y"), list)):
        raise bad_file(path, f"user {user!r} has no 'x' and 'y' arrays in user_data", rebuild)
    inputs, targets = entry["x"], entry["y"]
    if len(inputs) != len(targets):
        raise bad_file(path, f"user {user!r} has {len(inputs)} inputs (x) but {len(targets)} targets (y)", rebuild)
    if len(targets) != count:
        raise bad_file(path, f"says user {user!r} has {count} samples (num_samples), but its data holds "
                             f"{len(targets)}", rebuild)
    return inputs, targets


def _parse(path: pathlib.Path, rebuild: str):
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise bad_file(path, f"is {size} bytes, more than LEAF's largest file", rebuild)
        raw = path.read_bytes()
    except (OSError, MemoryError) as exc:
        raise bad_file(path, f"cannot be read ({reason(exc)})", rebuild) from exc
    try:
        return json.loads(raw)
    # What json raises on malformed text, bytes that are not UTF-8, and nesting too deep to parse.
    except (ValueError, RecursionError, MemoryError) as exc:
        raise bad_file(path, f"is not JSON ({reason(exc)})", rebuild) from exc


def _entries(path: pathlib.Path, data, rebuild: str) -> tuple[list[str], list[int], dict]:
    def bad(problem: str) -> ConfigError:
        return bad_file(path, problem, rebuild)

    if not isinstance(data, dict):
        raise bad(f"holds a JSON {json_type(data)}, not LEAF's object of users, num_samples and user_data")
    for key in ("users", "num_samples", "user_data"):
        if key not in data:
            raise bad(f"has no {key!r} entry (LEAF's files have users, num_samples and user_data)")
    users, counts, user_data = data["users"], data["num_samples"], data["user_data"]
    if not (isinstance(users, list) and all(isinstance(user, str) for user in users)):
        raise bad("has a 'users' entry that is not an array of names")
    if not (isinstance(counts, list) and all(type(count) is int for count in counts)):
        raise bad("has a 'num_samples' entry that is not an array of integers")
    if len(counts) != len(users):
        raise bad(f"lists {len(users)} users but {len(counts)} num_samples")
    if not isinstance(user_data, dict):
        raise bad(f"has a 'user_data' entry that is a JSON {json_type(user_data)}, not an object")
    repeated = next((user for user, times in collections.Counter(users).items() if times > 1), None)
    if repeated is not None:
        raise bad(f"lists user {repeated!r} twice in 'users'")
    unlisted = sorted(user_data.keys() - set(users))
    if unlisted:
        raise bad(f"has user_data for user {unlisted[0]!r}, who is not in 'users'")
    absent = next((user for user in users if user not in user_data), None)
    if absent is not None:
        raise bad(f"has no user_data for user {absent!r}")
    return users, counts, user_data


def json_type(value) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def reason(exc: BaseException) -> str:
    return (str(exc).strip() or type(exc).__name__)[:200]


def bad_file(path: pathlib.Path, problem: str, rebuild: str) -> ConfigError:
    return one_line(f"{path} {problem}; {rebuild}")


def one_line(message: str) -> ConfigError:
    # Paths, user names and exception texts may hold line breaks, and the CLI promises one line.
    return ConfigError(" ".join(message.splitlines()))
