"""Client states beyond engine.state_memory_mb spill to one file per worker shard and give the bits
of states kept in memory, through checkpoints, resumes and worker restarts; before round 1 a run
whose states fit neither the memory budget nor the disk is refused with one line, as is a state
directory that cannot be written; a damaged spill file is refused on resume; a full disk stops the
run with one line and a checkpoint it resumes from."""
import json
import os
import resource
import shutil
import textwrap
from dataclasses import dataclass

import pytest
import torch

import rayfed
from rayfed.algorithms.base import Algorithm
from rayfed.callbacks import Callback
from rayfed.checkpoint import read_checkpoint
from rayfed.cli import main
from rayfed.engine.state_store import LOCAL_COPIES, MemoryStore, RowCodec, SpilledStore, SpillFailed
from tests.test_checkpoint import ROUNDS, flip_byte, interrupted
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run
from tests.test_plugins import forget_plugins

LOCAL = SYNTHETIC_MLP + ["engine.backend=local", "train.checkpoint_every=2"]
SPILL = ["engine.state_memory_mb=0"]
STATEFUL = {
    "scaffold": [], "mifa": [], "feddyn": [], "fedgate": [], "moon": [], "gradma_w": [],
    "gradma": ["algorithm.memory_size=10"],
    "fedcomgate": ["compression.name=top_k", "algorithm.memory=true"],
    # Clients dropped by the overcommit never hear the server's reply: their update stays pending.
    "fedgate, overcommitted": ["algorithm.name=fedgate", "train.round_policy=overcommit", "train.overcommit=0.5",
                               "systems.step_time_spread=1.0"],
}


class ShardFiles(Callback):
    """The files in the state directory and the latest checkpoint's shard directory at each round's end."""

    def __init__(self, state_dir):
        self.state_dir = state_dir
        self.seen = []

    def on_round_end(self, run, record):
        shards = sorted((run.run_dir / "checkpoint.d").glob("*/*"))
        # The directory comes with the first shard a worker writes.
        files = sorted(os.listdir(self.state_dir)) if self.state_dir.is_dir() else []
        self.seen.append((files, [path.name for path in shards]))


def run(tmp_path, overrides, name, callbacks=()):
    return rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / name, progress=False,
                      callbacks=list(callbacks))


@pytest.mark.parametrize("name", STATEFUL)
def test_every_stateful_algorithm_spilled_has_the_bits_of_its_states_in_memory(tmp_path, name):
    overrides = LOCAL + [f"algorithm.name={name.split(',')[0]}", *STATEFUL[name]]
    in_memory = run(tmp_path, overrides, "memory")
    files = ShardFiles(tmp_path / "spilled" / "client_states")
    spilled = run(tmp_path, overrides + SPILL, "spilled", [files])
    assert_same_run(in_memory, spilled)
    assert spilled.summary["client_state_bytes"] == in_memory.summary["client_state_bytes"] > 0
    # One file for the local engine's one worker, and one copy of it in the latest checkpoint.
    # (The checkpoint of round 2 is written after the round's other callbacks.)
    assert files.seen == [(["shard-0-of-1.bin"], [])] * 2 + [(["shard-0-of-1.bin"], ["shard-0-of-1.bin"])] * 2
    checkpoint = read_checkpoint(spilled.run_dir)
    assert checkpoint.client_states == {} and [shard["worker"] for shard in checkpoint.state_shards] == [0]
    assert not (spilled.run_dir / "client_states").exists()      # the live shard goes with the run
    assert read_checkpoint(in_memory.run_dir).state_shards == [] and not (in_memory.run_dir / "checkpoint.d").exists()


@pytest.mark.parametrize("name", ["scaffold", "mifa"])
def test_a_spilled_run_resumes_bitwise(tmp_path, monkeypatch, name):
    overrides = SYNTHETIC_MLP + ROUNDS + ["engine.backend=local", f"algorithm.name={name}"]
    whole = run(tmp_path, overrides, "whole")
    run_dir = interrupted(tmp_path, overrides + SPILL, monkeypatch)
    assert [path.name for path in (run_dir / "checkpoint.d").iterdir()] == ["round-4"]
    assert_same_run(whole, rayfed.resume(run_dir, progress=False))


@pytest.fixture
def spilled_and_stopped(tmp_path, monkeypatch):
    return interrupted(tmp_path, SYNTHETIC_MLP + ROUNDS + ["engine.backend=local", "algorithm.name=mifa"] + SPILL,
                       monkeypatch)


def test_a_damaged_or_missing_spill_file_is_refused_on_resume_with_one_line(spilled_and_stopped, capsys):
    shard = spilled_and_stopped / "checkpoint.d" / "round-4" / "shard-0-of-1.bin"
    flip_byte(shard, offset_from_end=7)
    assert main(["run", "--resume", str(spilled_and_stopped), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"rayfed: error: {shard} is damaged: its bytes no longer match the SHA-256 that "
                                       f"checkpoint.pt holds for them\n")
    shard.unlink()
    assert main(["run", "--resume", str(spilled_and_stopped), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"rayfed: error: {shard} is missing; it holds spilled client states that "
                                       f"checkpoint.pt continues from\n")
    assert len((spilled_and_stopped / "metrics.jsonl").read_text().splitlines()) == 4       # left as it was


REMEDY = "raise engine.state_memory_mb, give engine.state_dir a disk with room, or lower data.num_clients"
SCAFFOLD_EXAMPLE = ["algorithm.name=scaffold", "model.name=mlp", "model.hidden_sizes=[2000,2000]",
                    "data.num_clients=10000"]


def test_states_that_fit_neither_the_memory_budget_nor_the_disk_are_refused_before_round_1(tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("rayfed.resources.physical_memory_bytes", lambda: 32 * 10**9)
    monkeypatch.setattr("rayfed.resources.shutil.disk_usage",
                        lambda path: shutil._ntuple_diskusage(10**12, 0, 10**11))
    assert main(["run", *SCAFFOLD_EXAMPLE, "--out", "out"]) == 2
    assert capsys.readouterr().err == (
        f"rayfed: error: client states need 166.1 GB (10000 clients x 4152010 floats of 4 bytes), more than the "
        f"26.5 GB this machine's memory leaves for them (engine.state_memory_mb unset) and the 100.0 GB free on "
        f"{tmp_path}; {REMEDY}\n")
    assert main(["run", *SCAFFOLD_EXAMPLE, "engine.state_memory_mb=50000", "train.checkpoint_every=10",
                 f"engine.state_dir={tmp_path / 'states'}"]) == 2
    assert capsys.readouterr().err == (
        f"rayfed: error: client states need 166.1 GB (10000 clients x 4152010 floats of 4 bytes and two copies for "
        f"train.checkpoint_every's checkpoints), more than engine.state_memory_mb=50000 and the 100.0 GB free on "
        f"{tmp_path}; {REMEDY}\n")
    assert os.listdir(tmp_path) == []
    # The config itself is sound: where its states go is a question for the machine that runs it.
    assert main(["config", *SCAFFOLD_EXAMPLE]) == 0 and "scaffold" in capsys.readouterr().out


@pytest.mark.parametrize("state_dir, problem", [
    ("/sys", "/sys: Permission denied"),
    ("{tmp}/file/states", "{tmp}/file is not a directory"),
])
def test_a_state_dir_that_cannot_be_written_is_refused_before_round_1(tmp_path, capsys, state_dir, problem):
    (tmp_path / "file").write_text("not a directory")
    state_dir = state_dir.format(tmp=tmp_path)
    assert main(["run", *LOCAL, "algorithm.name=scaffold", *SPILL, f"engine.state_dir={state_dir}",
                 "--out", str(tmp_path / "run")]) == 2
    refusal = (f"rayfed: error: engine.state_dir={state_dir} cannot be written ({problem.format(tmp=tmp_path)}); "
               f"choose a writable directory\n")
    assert capsys.readouterr().err == refusal
    assert not (tmp_path / "run").exists()
    # Named, it is checked even when the states fit in memory and would not use it.
    assert main(["run", *LOCAL, "algorithm.name=scaffold", f"engine.state_dir={state_dir}",
                 "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == refusal
    assert not (tmp_path / "run").exists()


def test_a_full_disk_stops_the_run_with_one_line_and_a_checkpoint_it_resumes_from(tmp_path, capsys, monkeypatch):
    """A file-size quota (RLIMIT_FSIZE) of 19 clients' states, which the shard outgrows in round 4,
    after the checkpoint of round 2: the resumed run plays rounds 3-6 again."""
    overrides = SYNTHETIC_MLP + ["engine.backend=local", "algorithm.name=scaffold", "model.hidden_sizes=[64]",
                                 "train.rounds=6", "train.checkpoint_every=2"]
    whole = run(tmp_path, overrides, "whole")
    out = tmp_path / "run"
    row = whole.summary["num_params"] * 4           # SCAFFOLD's control variate
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (19 * row, hard))
    try:
        code = main(["run", *overrides, *SPILL, "--out", str(out), "--quiet"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 1
    assert capsys.readouterr().err == (
        f"rayfed: stopped: cannot write worker 0's client states to {out / 'client_states' / 'shard-0-of-1.bin'}: "
        f"File too large; stopped after round 3; resume from the last checkpoint with: rayfed run --resume {out}\n")
    assert json.loads((out / "summary.json").read_text())["status"] == "disk_full"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3 and read_checkpoint(out).rounds_completed == 2
    assert_same_run(whole, rayfed.resume(out, progress=False))


@dataclass
class Tracked:
    tracking: torch.Tensor              # float32 (3,)
    scale: torch.Tensor                 # bfloat16 (2,)
    memory: torch.Tensor | None         # None in every state
    update: torch.Tensor | None         # transient
    steps: int


class TrackedAlgorithm(Algorithm):
    """A stand-in with FedGATE's kinds of field."""
    state_classes = (Tracked,)
    transient_client_fields = ("update",)


def tracked(clients, seed):
    generator = torch.Generator().manual_seed(seed)
    return {client: Tracked(torch.randn(3, generator=generator), torch.randn(2, generator=generator).bfloat16(), None,
                            torch.randn(2, 2, generator=generator) if client % 2 else None, client + seed)
            for client in clients}


def same_state(a, b, transient=True):
    return type(a) is type(b) is Tracked and list(vars(a)) == list(vars(b)) and torch.equal(a.tracking, b.tracking) \
        and torch.equal(a.scale, b.scale) and a.scale.dtype == torch.bfloat16 and a.memory is b.memory is None \
        and a.steps == b.steps \
        and (not transient or (a.update is None and b.update is None) or torch.equal(a.update, b.update))


def store(kind, path=None, copies=LOCAL_COPIES):
    codec = RowCodec(TrackedAlgorithm(), "tracked", 3 + 1)       # (3,) float32 and (2,) bfloat16: 4 floats' bytes
    if kind == "memory":
        return MemoryStore(codec, torch.device("cpu"), copies)
    return SpilledStore(path, codec, torch.device("cpu"), num_clients=20, worker_index=1, num_workers=2, copies=copies)


def test_both_stores_keep_states_in_first_commit_order_and_read_each_others_checkpoints(tmp_path):
    memory, spilled = store("memory"), store("spilled", tmp_path / "live" / "shard-1-of-2.bin")
    first, second = tracked([5, 1, 9], 0), tracked([9, 3], 1)
    for kept in (memory, spilled):
        kept.put_many(first)
        kept.put_many(second)
        assert len(kept) == 4 and kept.get(7) is None
        assert [state.steps for chunk in kept.chunks() for state in chunk] == [5, 1, 10, 4]
        assert all(same_state(kept.get(client), {**first, **second}[client], transient=False)
                   for client in (5, 1, 9, 3))
    # A transient field lives until the next put_many (a round's reply) when spilled; in memory, as given.
    assert same_state(spilled.get(9), second[9]) and spilled.get(1).update is None
    assert memory.get(1).update is first[1].update
    assert spilled.nbytes() == memory.nbytes() - sum(first[client].update.numel() * 4 for client in (5, 1))
    assert sorted(os.listdir(tmp_path / "live")) == ["shard-1-of-2.bin"]
    states_kept, shard = spilled.snapshot(str(tmp_path / "checkpoint"))
    assert states_kept == {} and shard["rows"] == 4 and os.listdir(tmp_path / "checkpoint") == ["shard-1-of-2.bin"]
    shard["path"] = str(tmp_path / "checkpoint" / "shard-1-of-2.bin")
    from_spilled, from_memory = store("memory"), store("spilled", tmp_path / "other" / "shard-1-of-2.bin")
    from_spilled.restore({}, shard)
    from_memory.restore(memory.snapshot(str(tmp_path / "unused"))[0], None)
    for restored in (from_spilled, from_memory):
        assert [state.steps for chunk in restored.chunks() for state in chunk] == [5, 1, 10, 4]
        assert all(same_state(restored.get(client), spilled.get(client), transient=False) for client in (5, 1, 9, 3))
    assert not (tmp_path / "unused").exists()
    with pytest.raises(rayfed.ConfigError, match=r"^algorithm 'tracked': field 'memory' of a client state was None in "
                                                 r"the first state and is tensor \[3\] float32 now"):
        spilled.put_many({11: Tracked(torch.zeros(3), torch.zeros(2).bfloat16(), torch.zeros(3), None, 0)})


def test_copies_relayed_from_another_node_are_the_local_copies_and_fail_with_one_line(tmp_path, monkeypatch,
                                                                                     ray_cluster):
    """A worker away from the driver's node hands its checkpoint copy to the relay there part by part
    (parts of 3 rows here) and reads it back the same way: the same bytes and manifest as a copy it writes
    itself. A worker on the driver's node makes no relay; a relay that died is made again; a damaged copy,
    a missing one and one that cannot be written fail as they do without the relay, in one line."""
    import ray
    from rayfed.engine import ray_copies, state_store
    monkeypatch.setattr(state_store, "COPY_CHUNK_BYTES", 3 * 32)
    driver_node = ray.get_runtime_context().get_node_id()
    here = ray_copies.RelayedCopies(driver_node, "rayfed-test-relay-here")

    class Elsewhere(ray_copies.RelayedCopies):
        """The copies as a worker on another node than the driver's has them."""

        def _here(self):
            return False

    elsewhere = Elsewhere(driver_node, "rayfed-test-relay")
    spilled = store("spilled", tmp_path / "live" / "shard-1-of-2.bin", copies=here)
    states = tracked(range(1, 20, 2), 0)
    spilled.put_many(states)
    assert spilled.codec.layout.row_bytes == 32
    local_kept, local = spilled.snapshot(str(tmp_path / "local"))
    assert ray_copies.existing_relay(here.name) is None and ray_copies.existing_relay(elsewhere.name) is None
    spilled.copies = elsewhere      # the same rows, now on another node than the run directory
    relayed_kept, relayed = spilled.snapshot(str(tmp_path / "relayed"))
    assert ray_copies.existing_relay(elsewhere.name) is not None
    assert local_kept == relayed_kept == {}
    assert (tmp_path / "relayed" / "shard-1-of-2.bin").read_bytes() == (tmp_path / "local" / "shard-1-of-2.bin"
                                                                        ).read_bytes()
    assert relayed["sha256"] == local["sha256"] and torch.equal(relayed["row_sha256"], local["row_sha256"])
    path = tmp_path / "relayed" / "shard-1-of-2.bin"
    assert not path.with_name("shard-1-of-2.bin.part").exists()
    killed = ray_copies.existing_relay(elsewhere.name)
    ray.kill(killed)
    for restored in (store("memory", copies=elsewhere),
                     store("spilled", tmp_path / "other" / "shard-1-of-2.bin", copies=elsewhere)):
        restored.restore({}, {**relayed, "path": str(path)})
        assert all(same_state(restored.get(client), spilled.get(client), transient=False) for client in states)
    assert ray_copies.existing_relay(elsewhere.name)._actor_id != killed._actor_id
    flip_byte(path, 20)
    for copies in (here, elsewhere):
        with pytest.raises(rayfed.ConfigError, match=rf"^{path} is damaged: its bytes no longer match the SHA-256 "
                                                     r"that checkpoint.pt holds for them$"):
            store("memory", copies=copies).restore({}, {**relayed, "path": str(path)})
        with pytest.raises(FileNotFoundError, match=rf"^\[Errno 2\] No such file or directory: '{tmp_path}/gone'$"):
            copies.read(tmp_path / "gone", 0, 1)
    (tmp_path / "a_file").write_text("")
    for copies in (here, elsewhere):
        spilled.copies = copies
        with pytest.raises(SpillFailed, match=rf"^cannot write the checkpoint's copy of worker 1's client states to "
                                              rf"{tmp_path / 'a_file' / 'shard-1-of-2.bin'}: File exists$"):
            spilled.snapshot(str(tmp_path / "a_file"))
    ray.kill(ray_copies.existing_relay(elsewhere.name))


def test_a_plugins_declared_state_spills_and_a_wrong_declaration_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drift.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass

        import torch
        import rayfed
        from rayfed.algorithms.fedavg import FedAvg

        @dataclass
        class DriftState:
            total: torch.Tensor
            visits: int

        @rayfed.register_algorithm("drift")
        class Drift(FedAvg):
            "FedAvg whose clients keep the sum of their model changes."
            state_classes = (*FedAvg.state_classes, DriftState)
            keeps_client_state = True
            floats = 1

            def client_state_floats(self, num_params, num_buffers):
                return self.floats * num_params

            def client_train(self, task, down, client_state):
                upload, _ = super().client_train(task, down, None)
                change = upload.tensors["model_change"]
                if client_state is None:
                    return upload, DriftState(change, 1)
                return upload, DriftState(client_state.total + change, client_state.visits + 1)

        @rayfed.register_algorithm("drift_undeclared")
        class Undeclared(Drift):
            floats = 0
        """))
    base = LOCAL + ["plugins=[./drift.py]"]
    try:
        in_memory = run(tmp_path, base + ["algorithm.name=drift"], "memory")
        assert_same_run(in_memory, run(tmp_path, base + ["algorithm.name=drift"] + SPILL, "spilled"))
        with pytest.raises(rayfed.ConfigError, match=r"^algorithm 'drift_undeclared' keeps \d+ floats per client in "
                                                     r"its client state but declares 0 \(Algorithm"):
            run(tmp_path, base + ["algorithm.name=drift_undeclared"], "undeclared")
    finally:
        forget_plugins()


@pytest.mark.slow
def test_on_ray_each_worker_spills_one_shard_restored_after_its_restart_with_the_in_memory_bits(tmp_path,
                                                                                                 ray_cluster):
    overrides = SYNTHETIC_MLP + [*ON_RAY, "engine.num_workers=2", "algorithm.name=mifa",
                                 "train.rounds=5", "train.checkpoint_every=2", "engine.fault_injection=['kill:1:4']"]
    in_memory = run(tmp_path, overrides, "memory")
    files = ShardFiles(tmp_path / "spilled" / "client_states")
    spilled = run(tmp_path, overrides + SPILL, "spilled", [files])
    assert_same_run(in_memory, spilled)
    assert spilled.history[3]["client_states_after_restart"] == "restored from the checkpoint of round 2"
    shards = ["shard-0-of-2.bin", "shard-1-of-2.bin"]
    # A worker makes its shard (the first one, the directory too) with its first commit, which overlaps the server's
    # step: at the end of round 1 it may still be running. From round 2 on the last round's has run, since a worker
    # commits before it trains again.
    assert set(files.seen[0][0]) <= set(shards) and files.seen[0][1] == []
    assert files.seen[1:] == [(shards, [])] + [(shards, shards)] * 3
    assert spilled.summary["client_state_bytes"] == in_memory.summary["client_state_bytes"] > 0
