"""Reading the files rayfed is given (configs, sweep files) or finds (run and sweep directories), so
that any of them ends in one line rather than a hang, a crash or a traceback: regular files only (a
FIFO blocks its reader, /dev/zero never ends), of bounded size, and YAML or JSON of bounded nesting,
without repeated keys, with integers that the numbers computed from them can hold."""
from __future__ import annotations

import copy
import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from rayfed.errors import ConfigError, show

MAX_CONFIG_FILE_BYTES = 2**20
# PyYAML composes nested collections by recursion; deeper input would end in a RecursionError.
MAX_YAML_DEPTH = 32
# What rayfed writes nests a few levels (metrics.jsonl's phase_s, summary.json's pss_by_process).
MAX_JSON_DEPTH = 32
# Counts and byte totals are 64-bit integers where rayfed writes them; beyond, numpy keeps Python
# objects and float() overflows (10**400).
MAX_JSON_INTEGER = 2**63


def read_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The file's bytes; ConfigError, naming the file as `what`, where it is missing, no regular file,
    or larger than `max_bytes`."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ConfigError(f"{what} is not a regular file")
        # O_NONBLOCK: a FIFO put in the file's place since the check above opens without waiting for a writer.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{what} does not exist") from None
    except OSError as error:
        raise ConfigError(f"{what} cannot be read ({error.strerror})") from None
    with open(descriptor, "rb") as file:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise ConfigError(f"{what} is not a regular file")
        try:
            data = file.read(max_bytes + 1)
        except OSError as error:
            raise ConfigError(f"{what} cannot be read ({error.strerror})") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what} holds {max(status.st_size, len(data))} bytes; it may hold at most {max_bytes}")
    return data


def read_text(path: str | os.PathLike, what: str, max_bytes: int) -> str:
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                          f"{error.start})") from None


# ---- YAML ----

class _Loader(yaml.SafeLoader):
    """SafeLoader that reports, as a YAML error with its position, what would otherwise end in a
    RecursionError (deep nesting), a ValueError (an integer of thousands of digits, 2024-13-45),
    a TypeError later (a !!set, which no value of rayfed's is), or a value silently lost (a key
    given twice, where PyYAML keeps the last)."""
    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except ValueError as error:
            reason = str(error).split(";")[0]
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {show(node.value)} ({reason})",
                                                    node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        # Only the mapping's own keys: those a merge (<<: *anchor) brings in are there to be overridden.
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue        # an unhashable key: PyYAML's own error names it
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {show(key)} is given twice (first at line {first.start_mark.line + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep)

    def construct_set(self, node):
        raise yaml.constructor.ConstructorError(None, None, "a set (!!set) is not a value rayfed reads",
                                                node.start_mark)


_Loader.add_constructor("tag:yaml.org,2002:set", _Loader.construct_set)


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> Any:
    """A sweep resolves each of its points from the same base file and the same few override values:
    parsing them once made reading a 1,404-point sweep about three times faster. Callers get a deep copy.
    At most 64 texts, so that config files of up to 1 MiB keep it under about 64 MiB."""
    return yaml.load(text, Loader=_Loader)


def parse_yaml(text: str, what: str, positions: bool = True) -> Any:
    try:
        return copy.deepcopy(_parsed(text))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark and positions else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{what} is not valid YAML{where}: {problem}") from None


def read_yaml(path: str | os.PathLike, what: str, max_bytes: int = MAX_CONFIG_FILE_BYTES) -> Any:
    """The YAML file's value; ConfigError, naming the file as `what`, where it cannot be one."""
    return parse_yaml(read_text(path, what, max_bytes), what)


# ---- JSON ----

def parse_json(text: str, what: str, constants: bool = False) -> Any:
    """Strict JSON (NaN and Infinity only with `constants`, as files written before rayfed wrote
    them as null hold them); ConfigError naming `what` where it is none, nests too deep or holds
    a number beyond what rayfed's statistics can hold."""
    try:
        value = json.loads(text, parse_int=_integer, parse_float=_float,
                           **({} if constants else {"parse_constant": _no_constant}))
    except RecursionError:
        raise ConfigError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{what} is not JSON: {error.msg} at column {error.colno}") from None
    except ValueError as error:
        raise ConfigError(f"{what} is not strict JSON: {error}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ConfigError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def read_json(path: Path, what: str, max_bytes: int, constants: bool = False) -> Any:
    return parse_json(read_text(path, what, max_bytes), what, constants)


def _integer(digits: str) -> int:
    length = len(digits.lstrip("-"))
    # The length first: int() of a long string takes time, or fails beyond 4300 digits.
    value = int(digits) if length <= len(str(MAX_JSON_INTEGER)) else None
    if value is None or not -MAX_JSON_INTEGER <= value < MAX_JSON_INTEGER:
        raise ValueError(f"an integer of {length} digits, beyond 64 bits")
    return value


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{show(text)} is beyond a double's range")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (rayfed writes an undefined number as null)")


def _depth(value) -> int:
    """How deep lists and mappings nest in `value` (a scalar: 0), without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (list, dict)):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                pending += [(item, depth) for item in (value.values() if isinstance(value, dict) else value)]
    return deepest
