"""checkpoint.pt every `train.checkpoint_every` rounds, which resume and recovery continue from."""
from __future__ import annotations

from rayfed.callbacks.base import Callback, RunView


class Checkpoints(Callback):
    def __init__(self, every: int):
        self.every = every

    def on_round_end(self, run: RunView, record: dict) -> None:
        done = run.rounds_completed
        # After the last round there is nothing left to resume.
        if done % self.every == 0 and done < run.config.train.rounds:
            run.checkpoint()
