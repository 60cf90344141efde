"""The registries of components: algorithms, models, datasets, partitioners, selectors,
compressors, callbacks, aggregation rules, attacks and privacy mechanisms, each a name -> entry table filled by decorators.

rayfed's own components register themselves the way a researcher's plugin does
(`rayfed.register_algorithm("name", params=...)` on a builder); nothing else lists them. The
names of a registry are what config validation, `rayfed algorithms`, sweeps and reports accept.
A registration remembers the module it came from, so that the ray engine can ship plugins to
its actors (rayfed.plugins)."""
from __future__ import annotations

import difflib
import importlib
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from rayfed.errors import ConfigError

BUILTIN_PREFIX = "rayfed."
# The module names rayfed.plugins gives the .py files it imports: messages name the file instead.
PLUGIN_FILE_PREFIX = "rayfed_plugin_"


class DuplicateName(ConfigError):
    """A registration under a name its registry already holds."""


@dataclass(frozen=True)
class Entry:
    """One registered component: `target` is what builds it (a class or a function); `options`
    what its kind declares beside it (an algorithm's parameter model, a dataset's shape, ...)."""

    kind: str
    name: str
    target: Any
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def module(self) -> str:
        return getattr(self.target, "__module__", "") or ""

    @property
    def source(self) -> str:
        """Where it was registered, as the user named it: a plugin file's path, else its module."""
        return plugin_source(self.module)

    @property
    def builtin(self) -> bool:
        return self.module.startswith(BUILTIN_PREFIX)

    def __getattr__(self, name: str) -> Any:
        # Only declared options: dunder look-ups (pickling's) must not reach `options` before it exists.
        options = self.__dict__.get("options", {})
        if name.startswith("__") or name not in options:
            raise AttributeError(name)
        return options[name]

    @property
    def doc(self) -> str:
        """The first paragraph of the target's docstring, on one line: what `rayfed algorithms` shows."""
        text = (getattr(self.target, "__doc__", None) or "").strip()
        return " ".join(text.split("\n\n")[0].split())


class Registry:
    """Names of one kind of component, in registration order (built-ins first, then plugins)."""

    def __init__(self, kind: str, key: str):
        self.kind = kind
        self.key = key          # the config key that names one, for messages: "algorithm.name"
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, **options) -> Callable[[Any], Any]:
        """A decorator: registers what it decorates under `name` and returns it unchanged."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{self.kind} names are identifiers (letters, digits, _), got {name!r}")

        def decorate(target: Any) -> Any:
            self.add(Entry(self.kind, name, target, options))
            return target
        return decorate

    def add(self, entry: Entry) -> None:
        existing = self._entries.get(entry.name)
        if existing is not None:
            if existing.target is entry.target:
                return          # the same module imported again (a plugin named twice, a re-run)
            raise DuplicateName(f"{self.kind} {entry.name!r} is already registered (by {existing.source}); "
                                f"{entry.source} must register it under another name")
        self._entries[entry.name] = entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def get(self, name: str) -> Entry:
        """The entry of `name`, or a ConfigError naming the key, the choices and the closest one."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ConfigError(unknown_name(self.key, name, self.names())) from None

    def remove(self, name: str) -> None:
        """For tests that register a component of their own."""
        self._entries.pop(name, None)


def keyed_builder(registry: Registry, name: str, keys: dict[str, Any] | None, section: str,
                  allowed: tuple[str, ...], returns: str) -> Callable[[Any], Any]:
    """The decorator that registers a builder `(section) -> component` under `name`, declaring the
    keys of `section` it takes (of `allowed`) with their defaults: register_rule's and register_attack's.
    A key not among `allowed` is the component's own: its value is in the section's `options`."""
    keys = dict(keys or {})
    caller = f"register_{registry.key.split('.')[1]}({name!r})"
    odd = sorted(key for key in keys if not (isinstance(key, str) and key.isidentifier()))
    if odd:
        raise ConfigError(f"{caller}: keys {', '.join(map(repr, odd))} are not identifiers")

    def decorate(builder):
        if not callable(builder):
            raise ConfigError(f"{caller} takes a function ({section} section) -> {returns}")
        return registry.register(name, keys=keys)(builder)
    return decorate


def plugin_source(module_name: str) -> str:
    """A module's name, or for a plugin file imported by rayfed.plugins, the file's path."""
    module = sys.modules.get(module_name)
    if module_name.startswith(PLUGIN_FILE_PREFIX) and getattr(module, "__file__", None):
        return module.__file__
    return module_name


def unknown_name(key: str, value: Any, choices: tuple[str, ...]) -> str:
    return f"{key}={value!r} is not one of: {', '.join(choices)}{did_you_mean(value, choices)}"


def did_you_mean(word: Any, candidates) -> str:
    if not isinstance(word, str) or len(word) > 100:
        return ""
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


ALGORITHMS = Registry("algorithm", "algorithm.name")
MODELS = Registry("model", "model.name")
DATASETS = Registry("dataset", "data.dataset")
PARTITIONERS = Registry("partitioner", "data.partition")
SELECTORS = Registry("selector", "selection.selector")
COMPRESSORS = Registry("compressor", "compression.name")
CALLBACKS = Registry("callback", "logging.callbacks")
AGGREGATION_RULES = Registry("aggregation rule", "aggregation.rule")
ATTACKS = Registry("attack", "adversary.attack")
PRIVACY_MECHANISMS = Registry("privacy mechanism", "privacy.mechanism")
REGISTRIES = {registry.kind: registry for registry in (ALGORITHMS, MODELS, DATASETS, PARTITIONERS, SELECTORS,
                                                        COMPRESSORS, CALLBACKS, AGGREGATION_RULES, ATTACKS,
                                                        PRIVACY_MECHANISMS)}


def plugin_entries() -> list[Entry]:
    """Every registration that is not rayfed's own: what an actor installs before it builds anything."""
    return [entry for registry in REGISTRIES.values() for entry in registry.entries() if not entry.builtin]


def install(entries: list[Entry]) -> None:
    """Makes `entries` (shipped from the driver) this process's plugins: those of an earlier run (an actor a
    later run reuses) go."""
    for registry in REGISTRIES.values():
        for entry in registry.entries():
            if not entry.builtin:
                registry.remove(entry.name)
    for entry in entries:
        REGISTRIES[entry.kind].add(entry)


def import_submodules(package: str, path) -> None:
    """Imports every module of a package, so that the components they register are there; the
    package lists none of them."""
    for module in sorted(pkgutil.iter_modules(path), key=lambda module: module.name):
        importlib.import_module(f"{package}.{module.name}")
