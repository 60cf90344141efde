"""`train.target_accuracy` / `train.target_loss`: the run ends at the first evaluated round that
reaches its targets, the measure behind every rounds-to-target table."""
from __future__ import annotations

from rayfed.callbacks.base import Callback, RunView, Stop

REACHED_TARGET = "reached_target"


class Target(Callback):
    def __init__(self, accuracy: float | None, loss: float | None):
        self.accuracy = accuracy
        self.loss = loss

    def on_round_end(self, run: RunView, record: dict) -> Stop | None:
        if "test_accuracy" not in record:
            return None
        reached = []
        if self.accuracy is not None:
            if not record["test_accuracy"] >= self.accuracy:
                return None
            reached.append(f"test accuracy {record['test_accuracy']:.4f} >= train.target_accuracy={self.accuracy}")
        if self.loss is not None:
            if not record["test_loss"] <= self.loss:
                return None
            reached.append(f"test loss {record['test_loss']:.4f} <= train.target_loss={self.loss}")
        return Stop(f"round {record['round']} reached its target: {' and '.join(reached)}", REACHED_TARGET)
