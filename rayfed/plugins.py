"""Plugins: a researcher's components in modules outside rayfed, registered with the same
decorators as the built-ins (rayfed.register_algorithm, ...).

They come in three ways: imported by the user's own Python before `rayfed.run(config)`; named in
the config's `plugins:` list (importable module names, or paths of .py files); or installed as a
package that declares an entry point in the group `rayfed.plugins`. A plugin that fails to import,
or registers a name that exists, is one line (ConfigError) before anything starts.

Ray actors get them without importing anything by path: the driver sends every plugin
registration with the actor's arguments, its classes pickled by value unless they come from an
installed package (which each node imports by name), and the actor installs them before it builds
anything. So a plugin file need not exist on the other nodes of a cluster."""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from rayfed.errors import ConfigError, first_line
from rayfed.registry import REGISTRIES, DuplicateName, Entry, install, plugin_entries

ENTRY_POINT_GROUP = "rayfed.plugins"
# What each plugin spec (a module name or a resolved file path) was loaded as, so that a spec named
# again (a second load_config, a resume, a sweep's trials in one process) is not imported twice.
_loaded: dict[str, ModuleType] = {}
_entry_points_loaded = False


def load_plugins(specs: list[str] = ()) -> None:
    """Imports the installed entry points of `rayfed.plugins` (once a process) and `specs`."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _guarded(f"entry point {entry_point.name} ({entry_point.value})", entry_point.load)
    for spec in specs:
        if _is_path(spec):
            path = Path(spec).expanduser().resolve()
            if str(path) not in _loaded:
                if not path.is_file():
                    raise ConfigError(f"plugins: {spec} is not a file (a plugin is an importable module name "
                                      f"or the path of a .py file)")
                _loaded[str(path)] = _guarded(spec, lambda: _import_file(path))
        elif spec not in _loaded:
            _loaded[spec] = _guarded(spec, lambda: importlib.import_module(spec))


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _import_file(path: Path) -> ModuleType:
    """The .py file as a module of its own name, distinct for distinct paths."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    name = f"rayfed_plugin_{path.stem if path.stem.isidentifier() else 'file'}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _guarded(what: str, load):
    """`load()`; what it registered is taken back, and one line says why, when it fails."""
    before = {kind: set(registry) for kind, registry in REGISTRIES.items()}
    try:
        return load()
    except BaseException as error:
        for kind, registry in REGISTRIES.items():
            for name in set(registry) - before[kind]:
                registry.remove(name)
        if isinstance(error, DuplicateName):
            raise ConfigError(f"plugin {what}: {error}") from None
        if isinstance(error, ConfigError):
            raise ConfigError(f"plugin {what}: {first_line(error)}") from None
        if isinstance(error, (Exception, SystemExit)):
            raise ConfigError(f"plugin {what} failed to import: {type(error).__name__}: {first_line(error)}") from None
        raise


def shippable_plugins() -> list[Entry]:
    """The plugin registrations an actor needs, ready to pickle: modules that are not installed
    packages (a file, a module beside the script) travel by value, since other processes and
    nodes cannot import them by name."""
    from ray import cloudpickle     # only the ray engine ships plugins; importing rayfed stays without Ray
    entries = plugin_entries()
    for module_name in {entry.module for entry in entries}:
        module = sys.modules.get(module_name)
        location = getattr(module, "__file__", None) or ""
        if module is not None and module_name != "__main__" and not _installed(location):
            cloudpickle.register_pickle_by_value(module)
    return entries


def _installed(location: str) -> bool:
    return "site-packages" in location or "dist-packages" in location


def install_plugins(entries: list[Entry]) -> None:
    """In an actor, before it builds anything: the driver's plugin registrations."""
    install(entries)
