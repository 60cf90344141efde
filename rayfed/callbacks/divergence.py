"""Stops a run whose model or loss stopped being finite: every later round would be noise."""
from __future__ import annotations

import math

from rayfed.callbacks.base import Callback, RunView
from rayfed.errors import RunStopped


class Divergence(Callback):
    def on_round_end(self, run: RunView, record: dict) -> None:
        problems = []
        if record.get("model_finite") is False:
            problems.append("the global model has NaN or infinite values")
        for key in ("train_loss", "test_loss"):
            value = record.get(key)
            undefined = key == "train_loss" and record["num_participants"] == 0     # nobody trained: nothing to judge
            if value is not None and not undefined and not math.isfinite(value):
                problems.append(f"{key} is {value}")
        if problems:
            algorithm, round = run.config.algorithm, record["round"]
            raise RunStopped(f"the run diverged in round {round}: {', '.join(problems)}; likely cause: learning "
                             f"rates too large for this model and data (algorithm.lr_local={algorithm.lr_local}, "
                             f"algorithm.lr_global={algorithm.lr_global}); {run.run_dir} keeps rounds 1-{round}",
                             "diverged")
