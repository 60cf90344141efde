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
from rayfed.registry import PLUGIN_FILE_PREFIX, REGISTRIES, DuplicateName, Entry, install, plugin_entries

ENTRY_POINT_GROUP = "rayfed.plugins"
# What each plugin (a module name or a resolved file path) was loaded as, so that one named again (a
# second load_config, a resume, a sweep's trials in one process) is not imported twice, with the SHA-256
# of its file then: the code this process runs, even where the file has changed or gone since.
_loaded: dict[str, tuple[ModuleType, str | None]] = {}
_entry_points_loaded = False


def load_plugins(specs: list = ()) -> list[dict[str, str]]:
    """Imports the installed entry points of `rayfed.plugins` (once a process) and `specs`: module
    names or .py paths, each alone or as the record this returns for it, `{"path": absolute path}` or
    `{"module": name}` with the SHA-256 of the file it was imported from. A record's SHA-256 must
    match the file now: a run's config.yaml pins its plugins' code, as a checkpoint pins config.yaml."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _guarded(f"entry point {entry_point.name} ({entry_point.value})", entry_point.load)
    records = []
    for spec in specs:
        record = _record(spec)
        what = record.get("path") or record["module"]
        if any(what == (earlier.get("path") or earlier["module"]) for earlier in records):
            raise ConfigError(f"plugins: {what} is listed twice")
        digest = _load_one(record, spec)
        if record.get("sha256") not in (None, digest):
            raise ConfigError(f"plugin {what} changed since the run that recorded it: SHA-256 "
                              f"{record['sha256'][:12]}... then, {(digest or 'none')[:12]}... now; restore it, or drop "
                              f"its sha256 to run it as it is now")
        records.append({**record, "sha256": digest} if digest else record)
    return records


def _record(spec) -> dict[str, str]:
    """A spec as its record: a path made absolute, so that a run's config.yaml finds the file from any directory."""
    if isinstance(spec, str):
        if _is_path(spec):
            return {"path": str(Path(spec).expanduser().resolve())}
        return {"module": spec}
    record = dict(spec) if isinstance(spec, dict) else spec.model_dump(exclude_none=True)
    if "path" in record:
        record["path"] = str(Path(record["path"]).expanduser().resolve())
    return record


def _load_one(record: dict[str, str], spec) -> str | None:
    """Imports the plugin `record` names (once a process); the SHA-256 of its file when it was imported."""
    if "module" in record:
        name = record["module"]
        if name not in _loaded:
            _loaded[name] = _with_digest(_guarded(name, lambda: importlib.import_module(name)))
        return _loaded[name][1]
    path = Path(record["path"])
    shown = spec if isinstance(spec, str) else record["path"]
    if str(path) not in _loaded:
        if not path.is_file():
            raise ConfigError(f"plugins: {shown} is not a file (a plugin is an importable module name "
                              f"or the path of a .py file)")
        # A file the user's own code imported already (import my_plugins) is that module, not a second copy.
        _loaded[str(path)] = _with_digest(_imported_from(path) or _guarded(shown, lambda: _import_file(path)))
    return _loaded[str(path)][1]


def _with_digest(module: ModuleType) -> tuple[ModuleType, str | None]:
    return module, _file_sha256(module)


def _imported_from(path: Path) -> ModuleType | None:
    """The module that the user's code imported from `path` (not one of rayfed's own imports of it)."""
    for name, module in list(sys.modules.items()):
        location = getattr(module, "__file__", None)
        if location and not name.startswith(PLUGIN_FILE_PREFIX) and Path(location).resolve() == path:
            return module
    return None


def _file_sha256(module: ModuleType) -> str | None:
    location = getattr(module, "__file__", None)
    if not location or not Path(location).is_file():
        return None         # a namespace package: no file of its own to pin
    return hashlib.sha256(Path(location).read_bytes()).hexdigest()


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _import_file(path: Path) -> ModuleType:
    """The .py file as a module of its own name, distinct for distinct paths (messages name the file:
    registry.Entry.source)."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    name = f"{PLUGIN_FILE_PREFIX}{path.stem if path.stem.isidentifier() else 'file'}_{digest}"
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
