"""The supervisor plays a run's rounds and keeps the run going when actors die.

A worker that dies is restarted by Ray and gets its clients' states back from the last
checkpoint (or starts them afresh without one). A server actor that dies is recreated from the
last checkpoint (or from the start), every worker goes back to that checkpoint's client states,
and the rounds since run again: the run ends with the bits of an uninterrupted one. The
supervisor writes metrics.jsonl and the checkpoints, and stops the run with one line saying why
when the model diverges or an actor is out of restarts.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from rayfed.checkpoint import Checkpoint, config_sha256, has_checkpoint, read_checkpoint, write_checkpoint
from rayfed.config import Config
from rayfed.engine.loop import Engine, ServerLost, WorkerLost, enact_due, play_round
from rayfed.engine.worker import client_owner
from rayfed.errors import RunStopped
from rayfed.faults import SERVER, FaultSchedule
from rayfed.metrics import MetricsLog, ProgressBar


class Supervisor:
    def __init__(self, engine: Engine, config: Config, run_dir: Path, history: list[dict], progress: ProgressBar):
        self.engine = engine
        self.config = config
        self.run_dir = run_dir
        self.history = history          # every round's metrics so far, resumed ones included
        self.progress = progress
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.faults = FaultSchedule(config.engine.fault_injection, config.engine.num_workers)
        self.server_restarts = 0
        self.gone_workers: list[int] = []
        # What became of the client states of workers revived between rounds, for the next round's metrics.
        self.revived_between_rounds: list[str] = []

    def restore(self, checkpoint: Checkpoint) -> None:
        """Puts the server and every worker in the checkpoint's state."""
        self.engine.get(self.engine.server.restore(checkpoint.server))
        self._restore_client_states(checkpoint.client_states, range(len(self.engine.workers)))

    def run(self) -> None:
        self.started = time.perf_counter()
        clients_keep_state = self.engine.get(self.engine.server.clients_keep_state())
        round = len(self.history)
        while round < self.config.train.rounds:
            try:
                self._play(round, clients_keep_state)
                round += 1
            except ServerLost:
                round = self._recover_server(round)

    def _play(self, round: int, clients_keep_state: bool) -> None:
        metrics = play_round(self.engine, round, clients_keep_state, self.faults)
        metrics["wall_time_s"] = time.perf_counter() - self.started
        died = [int(worker) for worker, why in metrics.get("failed_workers", {}).items() if why == "died"]
        if died:
            self.revived_between_rounds.append(self._revive(died, round))
        if self.revived_between_rounds:
            metrics["client_states_after_restart"] = "; ".join(self.revived_between_rounds)
            self.revived_between_rounds = []
        self.history.append(metrics)
        self.log.append(metrics)
        self.progress.update(metrics)
        if self.gone_workers and round + 1 < self.config.train.rounds:
            self._stop_without(round)
        _check_finite(metrics, self.config, self.run_dir)
        every = self.config.train.checkpoint_every
        if every and (round + 1) % every == 0 and round + 1 < self.config.train.rounds:
            self._checkpoint(round)
        for worker in range(len(self.engine.workers)):
            enact_due(self.engine, self.faults, worker, round, "idle")

    def _checkpoint(self, round: int) -> None:
        for target in (SERVER, *range(len(self.engine.workers))):
            enact_due(self.engine, self.faults, target, round, "checkpoint")
        server = self.engine.get(self.engine.server.snapshot())
        client_states = {}
        for states in self._ask_workers(lambda worker: worker.snapshot_client_states(), round):
            client_states.update(states)
        self._write_checkpoint(round + 1, server, client_states)

    def _write_checkpoint(self, rounds_completed: int, server: dict, client_states: dict) -> None:
        write_checkpoint(self.run_dir, Checkpoint(rounds_completed, self.config.algorithm.name,
                                                  self.config.model.name, config_sha256(self.config),
                                                  self.log.sha256(), server, client_states))

    def _ask_workers(self, call: Callable[[Any], Any], round: int) -> list:
        """`call` on every worker still in the run, resolved; workers that die meanwhile are revived
        and asked again."""
        while True:
            workers = [w for w in range(len(self.engine.workers)) if w not in self.gone_workers]
            try:
                return self.engine.get([call(self.engine.workers[w]) for w in workers])
            except WorkerLost as lost:
                self.revived_between_rounds.append(self._revive(lost.workers, round))
                if self.gone_workers and round + 1 < self.config.train.rounds:
                    self._stop_without(round)

    def _revive(self, workers: list[int], round: int) -> str:
        """Brings restarted workers back with their clients' states from the last checkpoint.
        Returns what happened, for metrics.jsonl; workers out of restarts join `gone_workers`."""
        checkpoint = read_checkpoint(self.run_dir) if has_checkpoint(self.run_dir) else None
        pending, gone = list(workers), []
        while pending:
            faults = {worker: fault for worker in pending for fault in self.faults.due(worker, round, "restart")}
            alive, newly_gone = self.engine.revive(pending, faults)
            gone += newly_gone
            try:
                if checkpoint is not None:
                    self._restore_client_states(checkpoint.client_states, alive)
                pending = []
            except WorkerLost as lost:
                pending = lost.workers
        self.gone_workers += gone
        outcome = f"workers {gone} did not come back; " if gone else ""
        if checkpoint is None:
            return outcome + "reset: no checkpoint"
        return outcome + f"restored from the checkpoint of round {checkpoint.rounds_completed}"

    def _restore_client_states(self, states: dict[int, Any], workers) -> None:
        num_workers = len(self.engine.workers)
        self.engine.get([self.engine.workers[w].restore_client_states(
            {client: state for client, state in states.items() if client_owner(client, num_workers) == w})
            for w in workers])

    def _stop_without(self, round: int) -> None:
        """Workers ran out of restarts: a last checkpoint of everything still known (the gone
        workers' clients as the previous checkpoint had them), then stop."""
        previous = read_checkpoint(self.run_dir) if has_checkpoint(self.run_dir) else None
        client_states = {}
        if previous is not None:
            num_workers = len(self.engine.workers)
            client_states = {client: state for client, state in previous.client_states.items()
                             if client_owner(client, num_workers) in self.gone_workers}
        server = self.engine.get(self.engine.server.snapshot())
        for states in self._ask_workers(lambda worker: worker.snapshot_client_states(), round):
            client_states.update(states)
        self._write_checkpoint(round + 1, server, client_states)
        workers = ", ".join(map(str, sorted(self.gone_workers)))
        raise RunStopped(f"worker {workers} died more than engine.worker_max_restarts="
                         f"{self.config.engine.worker_max_restarts} times; stopped after round {round + 1} with a "
                         f"checkpoint of what is still known; resume with: rayfed run --resume {self.run_dir}",
                         "workers_lost")

    def _recover_server(self, round: int) -> int:
        """Recreates the server from the last checkpoint (or from the start) and takes every worker's
        clients back to it; returns the round to go on from."""
        self.server_restarts += 1
        limit = self.config.engine.server_max_restarts
        if self.server_restarts > limit:
            resume = (f"resume from the last checkpoint with: rayfed run --resume {self.run_dir}"
                      if has_checkpoint(self.run_dir) else "there is no checkpoint to resume from")
            raise RunStopped(f"the server actor died in round {round + 1}, more than engine.server_max_restarts="
                             f"{limit} times; {resume}", "server_lost")
        self.engine.recreate_server()
        checkpoint = read_checkpoint(self.run_dir) if has_checkpoint(self.run_dir) else None
        if checkpoint is None:
            restart = 0
            self._ask_workers(lambda worker: worker.restore_client_states({}), round)
        else:
            restart = checkpoint.rounds_completed
            self.engine.get(self.engine.server.restore(checkpoint.server))
            self._restore_client_states(checkpoint.client_states, range(len(self.engine.workers)))
        lines = self.log.path.read_bytes().splitlines(keepends=True)[:restart]
        self.log.rewrite(lines)
        del self.history[restart:]
        self.progress.rewind(restart)
        origin = f"the checkpoint of round {restart}" if checkpoint else "the start"
        print(f"rayfed: the server actor died in round {round + 1}; recreated it from {origin} and running the "
              f"rounds since again", file=sys.stderr)
        return restart

    def final_state(self) -> dict:
        """What the summary and the Result report at the end of the run."""
        engine = self.engine
        round = self.config.train.rounds - 1
        client_state_bytes = sum(self._ask_workers(lambda worker: worker.client_state_bytes(), round))
        worker_peaks = self._ask_workers(lambda worker: worker.peak_rss(), round)
        return {"params": engine.get(engine.server.global_params()),
                "buffers": engine.get(engine.server.broadcast()).buffers,
                "server_state_bytes": engine.get(engine.server.state_bytes()),
                "client_state_bytes": client_state_bytes,
                "peaks": [engine.get(engine.server.peak_rss()), *worker_peaks],
                "server_restarts": self.server_restarts}


def _check_finite(metrics: dict, config: Config, run_dir: Path) -> None:
    problems = []
    if metrics.get("model_finite") is False:
        problems.append("the global model has NaN or infinite values")
    for key in ("train_loss", "test_loss"):
        value = metrics.get(key)
        undefined = key == "train_loss" and metrics["num_participants"] == 0     # nobody trained: nothing to judge
        if value is not None and not undefined and not math.isfinite(value):
            problems.append(f"{key} is {value}")
    if problems:
        round = metrics["round"]
        raise RunStopped(f"the run diverged in round {round}: {', '.join(problems)}; likely cause: learning rates "
                         f"too large for this model and data (algorithm.lr_local={config.algorithm.lr_local}, "
                         f"algorithm.lr_global={config.algorithm.lr_global}); {run_dir} keeps rounds 1-{round}",
                         "diverged")
