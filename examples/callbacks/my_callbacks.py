"""Two callbacks of your own, registered by name so that a config, the CLI, a sweep or
`ray job submit` can use them (`plugins: [examples/callbacks/my_callbacks.py]` and
`logging.callbacks: [...]`), or passed as objects: `rayfed.run(config, callbacks=[SaveModel(25)])`."""
from __future__ import annotations

import torch

import rayfed


@rayfed.register_callback("save_model")
class SaveModel(rayfed.Callback):
    """Saves the global model's state_dict every `every` rounds into the run directory's `folder`."""

    def __init__(self, every: int = 100, folder: str = "models"):
        self.every = every
        self.folder = folder

    def on_round_end(self, run: rayfed.RunView, record: dict) -> None:
        if record["round"] % self.every == 0:
            path = run.run_dir / self.folder / f"round{record['round']:05d}.pt"
            path.parent.mkdir(exist_ok=True)
            torch.save(run.global_model().state_dict(), path)


@rayfed.register_callback("stop_on_plateau")
class StopOnPlateau(rayfed.Callback):
    """Ends the run when the test accuracy has not improved by `min_delta` in `patience`
    evaluations in a row."""

    def __init__(self, patience: int = 5, min_delta: float = 0.0):
        self.patience = patience
        self.min_delta = min_delta

    def on_run_start(self, run: rayfed.RunView) -> None:
        # A resumed run counts from the rounds it continues from.
        self.best, self.waited = -1.0, 0
        for record in run.history:
            self._evaluated(record)

    def on_rewind(self, run: rayfed.RunView, rounds_completed: int) -> None:
        self.on_run_start(run)

    def on_round_end(self, run: rayfed.RunView, record: dict) -> rayfed.Stop | None:
        if self._evaluated(record) and self.waited >= self.patience:
            return rayfed.Stop(f"test accuracy {self.best:.4f} has not improved in {self.patience} evaluations")
        return None

    def _evaluated(self, record: dict) -> bool:
        accuracy = record.get("test_accuracy")
        if accuracy is None:
            return False
        if accuracy > self.best + self.min_delta:
            self.best, self.waited = accuracy, 0
        else:
            self.waited += 1
        return True
