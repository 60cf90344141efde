"""Callbacks named in a config (`logging.callbacks`), so that the CLI, sweeps and `ray job submit`
get them as `rayfed.run(config, callbacks=[...])` does.

An entry is a name registered with `rayfed.register_callback` (by a plugin module, which the
config's `plugins:` list imports) or the importable path of a class (`package.module.Class`),
alone or as a mapping `{name: ..., key: value, ...}` whose other keys are the constructor's
keyword arguments. Entries are checked (name, class, arguments) when the config is validated,
before anything starts; the callbacks are built when the run starts."""
from __future__ import annotations

import importlib
import inspect
from typing import Any

from rayfed.callbacks.base import Callback
from rayfed.errors import ConfigError, first_line
from rayfed.registry import CALLBACKS, did_you_mean

KEY = "logging.callbacks"


def register_callback(name: str):
    """A decorator: the Callback subclass it decorates can be named `name` in `logging.callbacks`."""
    return CALLBACKS.register(name)


def check_logging(logging) -> None:
    """The logging section's callbacks can be built, and MLflow is there when asked for."""
    for index, entry in enumerate(logging.callbacks):
        _resolve(index, entry)
    if logging.mlflow:
        from rayfed.callbacks.mlflow import mlflow_client_class
        mlflow_client_class()


def build_configured(entries: list) -> list[Callback]:
    callbacks = []
    for index, entry in enumerate(entries):
        kind, arguments = _resolve(index, entry)
        try:
            callbacks.append(kind(**arguments))
        except Exception as error:
            raise ConfigError(f"{KEY}[{index}]: {_label(entry)}({_show(arguments)}) failed: "
                              f"{type(error).__name__}: {first_line(error)}") from None
    return callbacks


def _resolve(index: int, entry: Any) -> tuple[type, dict]:
    where = f"{KEY}[{index}]"
    if isinstance(entry, dict):
        name = entry.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"{where} is a mapping without a name: give {{name: NAME, ...its keyword arguments}}")
        arguments = {key: value for key, value in entry.items() if key != "name"}
    else:
        name, arguments = entry, {}
    kind = _find(where, name)
    if not (isinstance(kind, type) and issubclass(kind, Callback)):
        raise ConfigError(f"{where}: {name} is not a subclass of rayfed.Callback")
    try:
        inspect.signature(kind).bind(**arguments)
    except TypeError as error:
        raise ConfigError(f"{where}: {name} does not take these arguments ({_show(arguments)}): {error}") from None
    return kind, arguments


def _find(where: str, name: str) -> Any:
    if name in CALLBACKS:
        return CALLBACKS.get(name).target
    module_name, _, attribute = name.rpartition(".")
    if not module_name:
        registered = ", ".join(CALLBACKS) or "none"
        raise ConfigError(f"{where}={name!r} is neither a registered callback (registered: {registered})"
                          f"{did_you_mean(name, CALLBACKS)} nor an importable module.Class path")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise ConfigError(f"{where}={name!r}: cannot import {module_name}: {type(error).__name__}: "
                          f"{first_line(error)}") from None
    if not hasattr(module, attribute):
        raise ConfigError(f"{where}={name!r}: module {module_name} has no {attribute}")
    return getattr(module, attribute)


def _label(entry: Any) -> str:
    return entry["name"] if isinstance(entry, dict) else entry


def _show(arguments: dict) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in arguments.items())
