"""The callback interface: what a run tells a callback, and what a callback may ask of the run.

Callbacks run in the driver, between rounds, in the order they are listed. They see each round's
metrics record and may read the global model, write files of their own, or ask the run to stop;
they never reach the server's or the clients' state, so a run's maths (and its bits) are the same
with or without them."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rayfed.registry import BUILTIN_PREFIX, plugin_source

if TYPE_CHECKING:
    from torch import Tensor, nn

    from rayfed.config import Config


@dataclasses.dataclass(frozen=True)
class Stop:
    """What `Callback.on_round_end` returns to end the run after this round. The run ends
    normally: summary.json records `status` and `reason` (as `stopped_because`), and `rayfed run`
    exits with 0."""

    reason: str
    """Why, in words: summary.json's `stopped_because`."""
    status: str = "stopped"
    """summary.json's `status`."""

    def __post_init__(self):
        """Checked here, so that a callback that builds a bad Stop fails in its own hook, naming itself,
        rather than the run writing the bad value into summary.json."""
        for name in ("reason", "status"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"rayfed.Stop: {name} must be a string, not {type(value).__name__} ({value!r:.80})")
            if not value.strip() or len(value.splitlines()) != 1:
                raise ValueError(f"rayfed.Stop: {name} must be one line of text, not {value!r:.80}")
        if self.status == "finished":
            raise ValueError("rayfed.Stop: status 'finished' is for a run that played all its rounds; a Stop ends "
                             "it early (its default status is 'stopped')")


class Callback:
    """Code of your own at fixed points of a run; override the hooks you need (each does nothing
    by default). Pass instances to `rayfed.run(config, callbacks=[...])`, or name the class in
    the config's `logging.callbacks` (see rayfed.callbacks.registry).

    Hooks, in the order a run calls them:
    - `on_rewind(run, rounds_completed)`: the rounds after `rounds_completed` are gone and will
      run again; on a resume (before `on_run_start`) and when a server actor that died is recreated
      from the last checkpoint.
    - `on_run_start(run)`: before the first round this process plays.
    - `on_round_end(run, record)`: after every round, with its metrics.jsonl record (a copy);
      return a `Stop` to end the run after it. With `logging.client_metrics`, `run.round_clients`
      holds the round's per-client rows, as clients.jsonl does.
    - `on_checkpoint(run, rounds_completed)`: after checkpoint.pt was written.
    - `on_run_end(run, summary)`: once, however the run ended (finished, stopped, failed), with
      the summary.json content, or None when the run ended before its first round and left
      nothing.

    A hook that raises stops the run: `rayfed run` prints one line naming the callback and exits
    with 1; the run directory keeps the rounds so far and the last checkpoint (resume from it).
    Raise rayfed.RunStopped to stop the run as failed with a line of your own."""

    def on_run_start(self, run: RunView) -> None:
        pass

    def on_round_end(self, run: RunView, record: dict) -> Stop | None:
        return None

    def on_checkpoint(self, run: RunView, rounds_completed: int) -> None:
        pass

    def on_rewind(self, run: RunView, rounds_completed: int) -> None:
        pass

    def on_run_end(self, run: RunView, summary: dict | None) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What building the run's model takes besides its config: the dataset's input shape and classes."""

    input_shape: tuple[int, ...]
    num_classes: int


class RunView:
    """The run as a callback sees it: its config and directory, the rounds so far, and the global
    model, fetched from the server only when asked for (a copy: changing it changes nothing)."""

    def __init__(self, config: Config, run_dir: Path, shape: ModelShape, history: list[dict],
                 round_clients: list[dict], fetch_global: Callable[[], tuple[Tensor, Tensor]],
                 checkpoint: Callable[[], None], resumed_from: int | None):
        self.config = config
        self.run_dir = run_dir
        self.resumed_from = resumed_from     # the rounds a resumed run continues from; None for a new run
        self._shape = shape
        self._history = history
        self._round_clients = round_clients
        self._fetch_global = fetch_global
        self._checkpoint = checkpoint

    @property
    def rounds_completed(self) -> int:
        return len(self._history)

    @property
    def history(self) -> Sequence[dict]:
        """Every round's record so far, resumed ones included, as metrics.jsonl holds them (a
        read-only view, not a copy: asking for it every round costs nothing)."""
        return _ReadOnly(self._history)

    @property
    def round_clients(self) -> Sequence[dict]:
        """The last round's per-client rows with `logging.client_metrics` (empty without it): for each
        client that counted, `round`, `client`, `num_samples` and the numbers it reported in its
        upload's metrics, as clients.jsonl holds them (a read-only view)."""
        return _ReadOnly(self._round_clients)

    def global_params(self) -> Tensor:
        """The global model's parameters as one flat float32 tensor, on the CPU."""
        return self._fetch_global()[0].clone()

    def global_buffers(self) -> Tensor:
        """Its floating-point buffers (BatchNorm's running statistics), flat."""
        return self._fetch_global()[1].clone()

    def global_model(self) -> nn.Module:
        """A fresh torch module of the run's model holding the global model, in eval mode."""
        from rayfed.models import FlatModel, build_model
        module = build_model(self.config.model.name, self._shape.input_shape, self._shape.num_classes,
                             self.config.model.hidden_sizes)
        params, buffers = self._fetch_global()
        flat = FlatModel(module)
        flat.params.copy_(params)
        flat.buffers.copy_(buffers)
        return module.eval()

    def checkpoint(self) -> None:
        """Writes checkpoint.pt now (what `train.checkpoint_every` does); on_checkpoint follows."""
        self._checkpoint()


class _ReadOnly(Sequence):
    def __init__(self, items: list):
        self._items = items

    def __getitem__(self, index):
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)


def builtin(callback: Callback) -> bool:
    """One of rayfed's own callbacks, which read the records they are given and never change them."""
    return type(callback).__module__.startswith(BUILTIN_PREFIX)


def callback_name(callback: Any) -> str:
    """The callback's class as the user wrote it: `module.Class`, or for a class in a plugin file, `Class
    (in FILE)`."""
    kind = type(callback)
    if kind.__module__ in ("__main__", "builtins"):
        return kind.__qualname__
    source = plugin_source(kind.__module__)
    if source != kind.__module__:
        return f"{kind.__qualname__} (in {source})"
    return f"{kind.__module__}.{kind.__qualname__}"
