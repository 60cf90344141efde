"""The supervisor plays a run's rounds and keeps the run going when actors die.

A worker that dies is restarted by Ray and gets its clients' states back from the last
checkpoint (or starts them afresh without one). A server actor that dies is recreated from the
last checkpoint (or from the start), every worker goes back to that checkpoint's client states,
and the rounds since run again: the run ends with the bits of an uninterrupted one. With
engine.worker_loss=replay a worker that dies (alone or with its node) does the same. The
supervisor tells the run's callbacks (rayfed.callbacks: metrics.jsonl, TensorBoard, the progress
bar, the divergence stop, the checkpoints, and the researcher's own) about each round, each
checkpoint and each rewind, ends the run when one of them asks, and stops it with one line saying
why when an actor is out of restarts.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from torch import Tensor

from rayfed.callbacks.base import Callback, ModelShape, RunView, Stop
from rayfed.callbacks.dispatch import CallbackList
from rayfed.callbacks.metrics_file import MetricsFile
from rayfed.checkpoint import (Checkpoint, config_sha256, has_checkpoint, read_checkpoint, shard_directory,
                               write_checkpoint)
from rayfed.checkpoint_content import Declared, check_content
from rayfed.config import Config
from rayfed.engine.extensions import Extension, make_extensions
from rayfed.engine.loop import Engine, RoundStart, enact_due, play_round
from rayfed.engine.lost import ServerLost, WorkerLost
from rayfed.engine.process_memory import PeakPss
from rayfed.engine.state_store import SpillFailed
from rayfed.engine.worker import client_owner
from rayfed.errors import ConfigError, RunStopped, first_line
from rayfed.faults import SERVER, FaultSchedule
from rayfed.metrics import CLIENT_ROWS, strict_json


class WorkersGone(Exception):
    """Workers Ray will not restart any more: a run with rounds left cannot go on without their clients."""


class Replay(Exception):
    """Workers died in a round or a checkpoint of a run with engine.worker_loss=replay: it goes back
    to the last checkpoint instead of going on without their clients."""

    def __init__(self, workers: list[int]):
        super().__init__(workers)
        self.workers = workers


class Supervisor:
    def __init__(self, engine: Engine, config: Config, run_dir: Path, shape: ModelShape, metrics_file: MetricsFile,
                 callbacks: list[Callback], declared: Declared, environment: dict[str, str],
                 resumed_from: int | None = None):
        """`declared`: what the run's components declare about their states, which a checkpoint
        recovered from must hold; `environment`: what decides the bits of the run's processes
        (rayfed.provenance), which every checkpoint records."""
        self.engine = engine
        self.environment = environment
        self.config = config
        self.run_dir = run_dir
        self.history: list[dict] = []   # every round's metrics so far, resumed ones included
        self.round_clients: list[dict] = []     # the last round's per-client rows (logging.client_metrics)
        self.metrics_file = metrics_file
        self.declared = declared
        self.callbacks = CallbackList(callbacks, (WorkerLost, ServerLost, WorkersGone, Replay, SpillFailed),
                                      self._kept)
        self.view = RunView(config, run_dir, shape, self.history, self.round_clients, self._global_model,
                            self._checkpoint, resumed_from)
        self.stop: tuple[Stop, Callback] | None = None
        self.final: dict | None = None
        self.faults = FaultSchedule(config.engine.fault_injection, config.engine.num_workers)
        self.server_restarts = 0
        self.gone_workers: dict[int, str] = {}      # workers that will not come back, with why
        # What became of the client states of workers revived between rounds, for the next round's metrics.
        self.revived_between_rounds: list[str] = []
        self.round = 0                  # the round being played: faults are scheduled by it
        self.memory = PeakPss(engine.process_pss)

    def resume_from(self, checkpoint: Checkpoint, lines: list[bytes]) -> None:
        """Continues from `checkpoint`, whose rounds are `lines` of metrics.jsonl: the server and every
        worker go back to it, and the rounds after it run again, so their lines go."""
        self._go_back_to(checkpoint)
        self.history[:] = [json.loads(line) for line in lines]
        self.callbacks.rewind(self.view, len(lines))

    def run(self) -> dict:
        """Plays the rounds left, or those until a callback stops the run; returns what the
        summary and the Result report."""
        self.started = time.perf_counter()
        self.callbacks.run_start(self.view)
        while True:
            try:
                return self._play_to_the_end()
            except ServerLost:
                self._recover_server()
            except Replay as lost:
                self._replay(lost.workers)
            except WorkersGone:
                self._stop_without_gone_workers()
            except SpillFailed as failed:
                # The last checkpoint still holds every state as it was: the run resumes from it.
                raise RunStopped(f"{first_line(failed)}; stopped after round {len(self.history)}; "
                                 f"{self._resume_hint()}", "disk_full") from None

    def close(self) -> None:
        unfired = self.faults.unfired()
        if unfired:
            print(f"rayfed: engine.fault_injection: never fired: {', '.join(unfired)}", file=sys.stderr)

    def _play_to_the_end(self) -> dict:
        clients_keep_state = self.engine.get(self.engine.server.clients_keep_state())
        # Asked once: what the run does beyond training, so rounds without it make no extra calls.
        extensions = make_extensions(self.engine.get(self.engine.server.extensions()))
        self._before_rounds(extensions, clients_keep_state)
        # Local: a server recreated or restored (the exceptions that leave this loop) plans afresh.
        start = None
        while len(self.history) < self.config.train.rounds and self.stop is None:
            start = self._play(len(self.history), clients_keep_state, extensions, start)
        self.final = self._final_state()
        return self.final

    def _play(self, round: int, clients_keep_state: bool, extensions: list[Extension],
              start: RoundStart | None) -> RoundStart | None:
        """Plays `round` from `start` (None: the server plans it now); returns what the next round starts from."""
        self.round = round
        metrics, next_start = play_round(self.engine, round, clients_keep_state, self.faults, extensions, start)
        self.round_clients[:] = metrics.pop(CLIENT_ROWS, [])
        metrics["wall_time_s"] = time.perf_counter() - self.started
        died = [int(worker) for worker, why in metrics.get("failed_workers", {}).items() if why == "died"]
        if died and self._replays():
            raise Replay(died)
        if died:
            self.revived_between_rounds.append(self._revive(died))
        if self.revived_between_rounds:
            metrics["client_states_after_restart"] = "; ".join(self.revived_between_rounds)
            self.revived_between_rounds = []
        self.history.append(strict_json(metrics))      # as metrics.jsonl and resumed rounds hold it
        # Callbacks get the round's own values: a NaN loss stays a float, where the file has null.
        self.stop = self.callbacks.round_end(self.view, metrics)
        # Before the idle moment's faults, which may be killing a worker.
        self.memory.at_round_end()
        if self.gone_workers and not self._all_rounds_done():
            raise WorkersGone()
        for worker in range(len(self.engine.workers)):
            enact_due(self.engine, self.faults, worker, round, "idle")
        return next_start

    def _before_rounds(self, extensions: list[Extension], clients_keep_state: bool) -> None:
        """The extensions' steps before round 0 (the selector's warm-up); they start over when a worker dies in them."""
        while True:
            try:
                for extension in extensions:
                    extension.before_rounds(self.engine, clients_keep_state)
                return
            except WorkerLost as lost:
                self.revived_between_rounds.append(self._revive(lost.workers))
                if self.gone_workers:
                    raise WorkersGone() from None

    def _all_rounds_done(self) -> bool:
        return len(self.history) == self.config.train.rounds

    def _checkpoint(self) -> None:
        """What a callback's `run.checkpoint()` does. With workers gone it leaves the checkpoint to
        the stop that follows the round, which keeps what the previous one had of their clients."""
        if self.gone_workers:
            raise WorkersGone()
        for target in (SERVER, *range(len(self.engine.workers))):
            enact_due(self.engine, self.faults, target, self.round, "checkpoint")
        directory = shard_directory(self.run_dir, len(self.history))
        self._write_checkpoint(self.engine.get(self.engine.server.snapshot()),
                               *self._client_states(directory, replay=True))

    def _global_model(self) -> tuple[Tensor, Tensor]:
        if self.final is not None:
            return self.final["params"], self.final["buffers"]
        return self.engine.get(self.engine.server.global_params()), self.engine.get(self.engine.server.final_buffers())

    def _kept(self) -> str:
        """What the run directory keeps, for the line of a run that stops."""
        return f"; {self.run_dir} keeps rounds 1-{len(self.history)}; {self._resume_hint()}"

    def _client_states(self, directory: Path, replay: bool = False) -> tuple[dict[int, Any], list[dict]]:
        """Every worker's client states for a checkpoint: states kept in memory, and the manifests
        of spilled shards, whose rows the workers copy into `directory` (named absolute: a worker's
        working directory need not be the driver's). With `replay` and
        engine.worker_loss=replay, a worker that dies meanwhile raises Replay (a revived one would
        hand over the previous checkpoint's states)."""
        client_states, shards = {}, []
        for states, shard in self._ask_workers(
                lambda worker: self.engine.workers[worker].snapshot_client_states(str(directory.absolute())),
                replay=replay):
            client_states.update(states)
            if shard is not None:
                shards.append({**shard, "file": (directory / shard["file"]).relative_to(self.run_dir).as_posix()})
        return client_states, shards

    def _write_checkpoint(self, server: dict, client_states: dict, shards: list[dict]) -> None:
        # The checkpoint records the digest of these lines: they must reach the disk before it does.
        self.metrics_file.sync()
        write_checkpoint(self.run_dir, Checkpoint(len(self.history), self.config.algorithm.name,
                                                  self.config.model.name, config_sha256(self.run_dir),
                                                  self.metrics_file.sha256(), server, client_states, shards,
                                                  environment=self.environment))
        self.callbacks.checkpoint(self.view, len(self.history))

    def _last_checkpoint(self) -> Checkpoint | None:
        """The checkpoint to recover from, checked as a resume checks it: a recovery from one that
        was damaged or edited since it was written stops the run with one line."""
        if not has_checkpoint(self.run_dir):
            return None
        try:
            checkpoint = read_checkpoint(self.run_dir)
            check_content(self.run_dir, checkpoint, self.declared)
        except ConfigError as error:
            raise RunStopped(f"{error}; the run cannot recover from it and stopped in round {self.round + 1}",
                             "checkpoint_damaged") from None
        return checkpoint

    def _ask_workers(self, call: Callable[[int], Any], workers: list[int] | None = None, replay: bool = False) -> list:
        """`call(worker)` on each of `workers` (default: every worker still in the run), resolved.
        Workers that die meanwhile are revived and asked again (with `replay` and
        engine.worker_loss=replay, Replay is raised instead); while rounds are left to play, a worker
        out of restarts raises WorkersGone."""
        while True:
            asked = [w for w in (range(len(self.engine.workers)) if workers is None else workers)
                     if w not in self.gone_workers]
            try:
                return self.engine.get([call(worker) for worker in asked])
            except WorkerLost as lost:
                if replay and self._replays():
                    raise Replay(lost.workers) from None
                self.revived_between_rounds.append(self._revive(lost.workers))
                if self.gone_workers and not self._all_rounds_done():
                    raise WorkersGone() from None

    def _replays(self) -> bool:
        return self.config.engine.worker_loss == "replay"

    def _revive(self, workers: list[int]) -> str:
        """Brings restarted workers back with their clients' states from the last checkpoint.
        Returns what happened, for metrics.jsonl; workers that will not come back join `gone_workers`."""
        checkpoint = self._last_checkpoint()
        pending, gone = list(workers), {}
        while pending:
            faults = {worker: fault for worker in pending for fault in self.faults.due(worker, self.round, "restart")}
            alive, newly_gone = self.engine.revive(pending, faults)
            gone.update(newly_gone)
            try:
                if checkpoint is not None:
                    self.engine.get([self._restore_call(checkpoint, worker) for worker in alive])
                pending = []
            except WorkerLost as lost:
                pending = lost.workers
        self.gone_workers.update(gone)
        outcome = f"workers {sorted(gone)} did not come back; " if gone else ""
        if checkpoint is None:
            return outcome + "reset: no checkpoint"
        return outcome + f"restored from the checkpoint of round {checkpoint.rounds_completed}"

    def _restore_call(self, checkpoint: Checkpoint | None, worker: int):
        """The worker's clients back to `checkpoint` (None: no state): the states it holds of them,
        and its spilled shard, which the worker reads from the run directory."""
        if checkpoint is None:
            return self.engine.workers[worker].restore_client_states({}, None)
        num_workers = len(self.engine.workers)
        shard = next((shard for shard in checkpoint.state_shards if shard["worker"] == worker), None)
        return self.engine.workers[worker].restore_client_states(
            {client: state for client, state in checkpoint.client_states.items()
             if client_owner(client, num_workers) == worker},
            None if shard is None else {**shard, "path": str((self.run_dir / shard["file"]).absolute())})

    def _go_back_to(self, checkpoint: Checkpoint | None) -> None:
        """The server and every worker as at `checkpoint` (None: as at the start)."""
        if checkpoint is not None:
            self.engine.get(self.engine.server.restore(checkpoint.server))
        self._ask_workers(lambda worker: self._restore_call(checkpoint, worker))

    def _stop_without_gone_workers(self) -> None:
        """A last checkpoint of everything still known (the gone workers' clients as the previous
        checkpoint had them), then the run stops."""
        try:
            previous = self._last_checkpoint()
            num_workers = len(self.engine.workers)
            client_states = {client: state for client, state in (previous.client_states if previous else {}).items()
                             if client_owner(client, num_workers) in self.gone_workers}
            directory = shard_directory(self.run_dir, len(self.history))
            shards = [self._carry(shard, directory) for shard in (previous.state_shards if previous else [])
                      if shard["worker"] in self.gone_workers]
            server = self.engine.get(self.engine.server.snapshot())
            while True:
                try:
                    states, kept = self._client_states(directory)
                    break
                except WorkersGone:
                    continue        # another worker gone: ask those that are left
            client_states.update(states)
            self._write_checkpoint(server, client_states, shards + kept)
            saved = f"stopped after round {len(self.history)} with a checkpoint of what is still known"
        except ServerLost:
            saved = f"the server died too; stopped after round {len(self.history)}"
        raise RunStopped(f"{self._gone()}; {saved}; {self._resume_hint()}", "workers_lost")

    def _gone(self) -> str:
        """The workers gone, by why: `worker 1 died more than engine.worker_max_restarts=3 times`."""
        by_why: dict[str, list[int]] = {}
        for worker, why in sorted(self.gone_workers.items()):
            by_why.setdefault(why, []).append(worker)
        return "; ".join(f"worker {', '.join(map(str, workers))} {why}" for why, workers in by_why.items())

    def _carry(self, shard: dict, directory: Path) -> dict:
        """A gone worker's spilled shard from the previous checkpoint, copied into the next one's `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / Path(shard["file"]).name
        shutil.copyfile(self.run_dir / shard["file"], target)
        return {**shard, "file": target.relative_to(self.run_dir).as_posix()}

    def _resume_hint(self) -> str:
        if has_checkpoint(self.run_dir):
            return f"resume from the last checkpoint with: rayfed run --resume {self.run_dir}"
        return "there is no checkpoint to resume from"

    def _recover_server(self) -> None:
        """Recreates the server from the last checkpoint (or from the start), takes every worker's
        clients back to it, and forgets the rounds since: they run again."""
        self.server_restarts += 1
        limit = self.config.engine.server_max_restarts
        if self.server_restarts > limit:
            raise RunStopped(f"the server actor died in round {self.round + 1}, more than "
                             f"engine.server_max_restarts={limit} times; {self._resume_hint()}", "server_lost")
        origin = self._rewind("while the server was being recreated")
        print(f"rayfed: the server actor died in round {self.round + 1}; recreated it from {origin} and running the "
              f"rounds since again", file=sys.stderr)

    def _replay(self, workers: list[int]) -> None:
        """engine.worker_loss=replay: the dead workers restarted, then the run as after a server loss. Restarted
        first: a call to a worker Ray cannot place (its node died, the others are full) would wait forever."""
        self._revive(workers)
        if self.gone_workers:
            raise RunStopped(f"{self._gone()}; stopped in round {self.round + 1}, the last checkpoint kept "
                             f"(engine.worker_loss=replay); {self._resume_hint()}", "workers_lost")
        origin = self._rewind("while the run went back to its last checkpoint")
        print(f"rayfed: worker {', '.join(map(str, workers))} died in round {self.round + 1}; went back to {origin} "
              f"and running the rounds since again (engine.worker_loss=replay)", file=sys.stderr)

    def _rewind(self, moment: str) -> str:
        """A new server from the last checkpoint (or from the start), every worker's clients back to it, and
        the rounds since forgotten: they run again. A fresh server, not a restored one, so that nothing a
        snapshot leaves out survives the rounds that are replayed. Returns where the run went back to."""
        checkpoint = self._last_checkpoint()
        try:
            self.engine.recreate_server()
            self._go_back_to(checkpoint)
        except WorkersGone:
            raise RunStopped(f"{self._gone()} {moment}; {self._resume_hint()}", "workers_lost") from None
        restart = checkpoint.rounds_completed if checkpoint is not None else 0
        del self.history[restart:]
        self.round_clients.clear()
        self.stop = None
        self.callbacks.rewind(self.view, restart)
        self.revived_between_rounds = []
        return f"the checkpoint of round {restart}" if checkpoint is not None else "the start"

    def _final_state(self) -> dict:
        engine = self.engine
        client_state_bytes = sum(self._ask_workers(lambda worker: engine.workers[worker].client_state_bytes()))
        worker_peaks = self._ask_workers(lambda worker: engine.workers[worker].peak_rss())
        self.memory.sample()
        return {"params": engine.get(engine.server.global_params()),
                "buffers": engine.get(engine.server.final_buffers()),
                "server_state_bytes": engine.get(engine.server.state_bytes()),
                "client_state_bytes": client_state_bytes,
                "peaks": [engine.get(engine.server.peak_rss()), *worker_peaks],
                "peak_pss_bytes": self.memory.bytes,
                "pss_by_process": self.memory.by_process,
                "server_restarts": self.server_restarts,
                "summary_extras": engine.get(engine.server.summary_extras())}

