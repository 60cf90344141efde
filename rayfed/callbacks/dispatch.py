"""Calls every callback's hook in order, and turns a callback's own failure into one line."""
from __future__ import annotations

import copy
import sys
from typing import Callable

from rayfed.callbacks.base import Callback, RunView, Stop, builtin, callback_name
from rayfed.errors import RunStopped, first_line


class CallbackFailed(RunStopped):
    """A callback raised: the run stops with one line naming it (exit code 1)."""

    def __init__(self, message: str):
        super().__init__(message, "callback_failed")


class CallbackList:
    """`passthrough`: exceptions that are the run's own control flow (an actor lost in a call a
    hook made, a deliberate RunStopped), which go on as they are. `where` says, for the line of a
    failed callback, what the run directory keeps."""

    def __init__(self, callbacks: list[Callback], passthrough: tuple[type[BaseException], ...] = (),
                 where: Callable[[], str] = lambda: ""):
        self.callbacks = list(callbacks)
        self.passthrough = (RunStopped, *passthrough)
        self.where = where

    def rewind(self, run: RunView, rounds_completed: int) -> None:
        for callback in self.callbacks:
            self._call(callback, "on_rewind", run, rounds_completed)

    def run_start(self, run: RunView) -> None:
        for callback in self.callbacks:
            self._call(callback, "on_run_start", run)

    def round_end(self, run: RunView, record: dict) -> tuple[Stop, Callback] | None:
        """Every callback sees the round (a stop asked for by one does not hide it from the
        rest); returns the first stop asked for and who asked. A callback of the researcher's
        gets a copy of the record, so that what it changes reaches neither the others nor the run."""
        stop = None
        for callback in self.callbacks:
            given = record if builtin(callback) else copy.deepcopy(record)
            asked = self._call(callback, "on_round_end", run, given)
            if asked is not None and stop is None:
                if not isinstance(asked, Stop):
                    raise CallbackFailed(f"callback {callback_name(callback)}: on_round_end returned "
                                         f"{type(asked).__name__}, not None or rayfed.Stop{self.where()}")
                stop = (asked, callback)
        return stop

    def checkpoint(self, run: RunView, rounds_completed: int) -> None:
        for callback in self.callbacks:
            self._call(callback, "on_checkpoint", run, rounds_completed)

    def run_end(self, run: RunView, summary: dict | None) -> None:
        """Every callback ends, even after one fails (they may hold files or connections open);
        then the first failure is raised."""
        failures = []
        for callback in self.callbacks:
            try:
                self._call(callback, "on_run_end", run, summary)
            except RunStopped as failure:
                failures.append(failure)
        if failures:
            raise failures[0]

    def run_end_after_failure(self, run: RunView, summary: dict | None) -> None:
        """As run_end, while the run is already failing: a callback's failure is told on stderr,
        and the run's own error is what the caller raises."""
        try:
            self.run_end(run, summary)
        except RunStopped as failure:
            print(f"rayfed: {failure}", file=sys.stderr)

    def _call(self, callback: Callback, hook: str, *arguments):
        try:
            return getattr(callback, hook)(*arguments)
        except self.passthrough:
            raise
        except Exception as error:
            raise CallbackFailed(f"callback {callback_name(callback)} failed in {hook}: {type(error).__name__}: "
                                 f"{first_line(error)}{self.where()}") from error
