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
            round = record["round"]
            raise RunStopped(f"the run diverged in round {round}: {', '.join(problems)}; likely cause: "
                             f"{likely_cause(run.config)}; {run.run_dir} keeps rounds 1-{round}", "diverged")


def likely_cause(config) -> str:
    """What most likely made the run diverge, from its config. A local SGD step with weight decay lambda
    multiplies the weights by 1 - lr lambda (coupled or decoupled) before the loss's own step: beyond
    lr lambda = 2 that factor exceeds 1 in size and grows the weights whatever the data; from lr lambda = 1
    on it leaves less than half of SGD's stability limit lr (L + lambda) < 2 to the loss's curvature L."""
    algorithm, decay = config.algorithm, config.train.weight_decay
    rates = f"algorithm.lr_local={algorithm.lr_local}, algorithm.lr_global={algorithm.lr_global}"
    product = algorithm.lr_local * decay
    if product > 2:
        return (f"weight decay: each local step multiplies the weights by 1 - algorithm.lr_local * "
                f"train.weight_decay = {1 - product:.6g}, which grows them whatever the data "
                f"(train.weight_decay={decay}, algorithm.lr_local={algorithm.lr_local}: their product must stay "
                f"below 2)")
    if product >= 1:
        return (f"learning rates too large with this weight decay: algorithm.lr_local * train.weight_decay = "
                f"{product:.6g} leaves little of SGD's stability limit 2 to the loss ({rates}, "
                f"train.weight_decay={decay})")
    return f"learning rates too large for this model and data ({rates})"
