"""Property: whatever keys and values `rayfed config` is given, as overrides or in a YAML file, it
either prints a config that loads back to itself (exit 0) or says what is wrong in one line (exit 2),
never a traceback."""
import functools
import math
import pathlib
import tempfile
import typing

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayfed.cli import main
from rayfed.config import Config, all_keys
from rayfed.preflight import load_config

KEYS = all_keys()
MISSPELLED_KEYS = ["train.round", "algorithm.lr", "model", "data", "engine.backend.x", "seedling", "a\nb", "x\0y"]


@functools.cache
def plausible(key):
    """Values of the key's declared type, mostly in range: configs that now and then resolve."""
    section, _, leaf = key.rpartition(".")
    declared = typing.get_type_hints(type(getattr(Config(), section)) if section else Config)[leaf]
    options = typing.get_args(declared) if typing.get_origin(declared) is typing.Union else (declared,)
    return st.one_of([_plausible(option) for option in options])


def _plausible(declared):
    if declared is type(None):
        return st.none()
    if typing.get_origin(declared) is typing.Literal:
        return st.sampled_from(typing.get_args(declared))
    if declared is bool:
        return st.booleans()
    if declared is int:
        return st.integers(0, 200)
    if declared is float:
        return st.floats(0.0, 2.0)
    if declared == list[int]:
        return st.lists(st.integers(1, 64), max_size=3)
    if declared == list[str]:
        return st.lists(st.sampled_from(["kill:0:2", "delay:1:3:0.5", "kill_server:2:checkpoint", "kill"]), max_size=2)
    return st.sampled_from(["last_local", "global", "model", "tensor", "ray://head:10001"]) | st.text(max_size=8)


@functools.cache
def scalars():
    edge_numbers = st.sampled_from([0, -1, 1, 2, 10**7, 10**7 + 1, 2**63, 10**30, 10**400, -0.0, 0.5, 1.0, 1e6,
                                    1e12, 1e308, math.nan, math.inf, -math.inf, 1e-320])
    edge_strings = st.sampled_from(["nan", "inf", ".inf", "-inf", "1e400", "1e9", "1e24", "abc", "", "a\nb",
                                    "a\0b", "\u2028", "x" * 300, "yes", "~", "[1", "2024-13-45"])
    return st.none() | st.booleans() | edge_numbers | edge_strings | st.integers() | st.floats() | st.text(max_size=12)


@functools.cache
def nested():
    return st.recursive(scalars(), lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@st.composite
def configs(draw):
    """{dotted key: value} with real keys (now and then a misspelled one)."""
    keys = draw(st.lists(st.sampled_from(KEYS + MISSPELLED_KEYS), max_size=4, unique=True))
    return {key: draw(plausible(key) if key in KEYS and draw(st.integers(0, 3)) else nested()) for key in keys}


def as_override(key, value):
    return f"{key}={yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()}"


def as_yaml(config):
    tree = {}
    for key, value in config.items():
        *sections, leaf = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {}) if isinstance(node, dict) else node
        if isinstance(node, dict):
            node[leaf] = value
    return yaml.safe_dump(tree, allow_unicode=False)


MALFORMED_FILES = [b"", b"seed: [", b"- 1\n", b"seed: \xff\xfe\n", b"a: " + b"[" * 100 + b"]" * 100, b"\x00"]


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(config=configs(), source=st.sampled_from(["overrides"] * 16 + ["file"] * 16 + MALFORMED_FILES))
def test_config_command_prints_a_loadable_config_or_one_line(capsys, config, source):
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        path, overrides = None, [as_override(key, value) for key, value in config.items()]
        if source != "overrides":
            path = folder / "in.yaml"
            path.write_bytes(as_yaml(config).encode() if source == "file" else source)
            overrides = overrides if isinstance(source, bytes) else []
        code = main(["config", *([str(path)] if path else []), *overrides])
        out, err = capsys.readouterr()
        if code == 2:
            assert out == "" and err.startswith("rayfed: error: ") and len(err.splitlines()) == 1, err
            assert err.count("\n") == 1 and err.endswith("\n"), err
            return
        assert code == 0 and err == "", (code, err)
        printed = folder / "printed.yaml"
        printed.write_text(out)
        loaded = load_config(printed)
        assert loaded == load_config(path, overrides)
        assert loaded.to_yaml() == out


def test_a_mapping_in_the_file_where_a_value_belongs_with_an_override_of_it_is_one_line_or_loads(capsys, tmp_path):
    """Every key set to a mapping in the file and overridden on the command line: the override is the
    value (the config prints and loads back) or one line says what is wrong; never a traceback."""
    path = tmp_path / "in.yaml"
    for key in KEYS:
        for mapping in ({}, {"a": 1}):
            path.write_text(as_yaml({key: mapping}))
            value = Config().to_dict()
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            code = main(["config", str(path), as_override(key, value)])
            out, err = capsys.readouterr()
            assert (code, err) == (0, "") or (code == 2 and err.startswith("rayfed: error: ")
                                              and err.count("\n") == 1 and out == ""), (key, code, err)
            if code == 0:
                assert load_config(path, [as_override(key, value)]).to_yaml() == out
