"""A checkpoint is checked by its content, not only by its digest: every edit a tool could make
while recomputing checkpoint.pt's digest (tests/checkpoint_damage.py) is refused on resume with one
line naming the field, exit 2, the run directory unchanged, for every registered algorithm and a
plugin's; the undamaged checkpoint resumes to the bits of the uninterrupted run."""
import hashlib
import io
import json
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

import rayfed
from rayfed.checkpoint import MAGIC, read_checkpoint
from rayfed.cli import main
from tests.checkpoint_damage import CASES, PLUGIN, algorithms, build, load_body, rewrite
from tests.test_engine_equivalence import assert_same_run
from tests.test_plugins import forget_plugins

PLUGIN_ALGORITHM = "drift_fedavg"
# One worker runs the module, so that each algorithm's checkpoint is built once.
pytestmark = pytest.mark.xdist_group("checkpoint_content")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each algorithm's resumable run directory and its uninterrupted run, built on first use."""
    root = tmp_path_factory.mktemp("checkpoints")
    plugin = root / "drift_plugin.py"
    plugin.write_text(PLUGIN)
    built = {}

    def get(name):
        if name not in built:
            built[name] = build(root, name, plugin if name == PLUGIN_ALGORITHM else None)
        return built[name]
    yield get
    forget_plugins()


def digest_of(run_dir):
    digest = hashlib.sha256()
    for path in sorted(run_dir.rglob("*")):
        digest.update(str(path.relative_to(run_dir)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def refused(run_dir, capsys):
    """The line a resume of `run_dir` refused it with (exit 2, one line, nothing changed)."""
    before = digest_of(run_dir)
    code = main(["run", "--resume", str(run_dir), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("rayfed: error: "), (code, err)
    assert digest_of(run_dir) == before
    return err.removeprefix("rayfed: error: ").strip()


@pytest.mark.parametrize("name", algorithms() + [PLUGIN_ALGORITHM])
def test_an_undamaged_checkpoint_resumes_bitwise(name, checkpoints, tmp_path):
    source, whole = checkpoints(name)
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    assert_same_run(whole, rayfed.resume(run_dir, progress=False))


@pytest.mark.parametrize("name", algorithms() + [PLUGIN_ALGORITHM])
def test_every_edit_is_refused_with_one_line_naming_it(name, checkpoints, tmp_path, capsys):
    """Each case with the header's digest recomputed; those the content shows, also with every
    digest the header records recomputed (only the content checks left)."""
    source, _ = checkpoints(name)
    _, payload = load_body(source / "checkpoint.pt")
    applied = 0
    for case_name, case in CASES.items():
        if not case.applies(payload):
            continue
        applied += 1
        expected = case.expected(payload)
        content = case.content(payload) if callable(case.content) else case.content
        for every_digest in (False, True) if content else (False,):
            run_dir = tmp_path / f"{applied}-{every_digest}"
            shutil.copytree(source, run_dir)
            rewrite(run_dir, case.edit, every_digest)
            line = refused(run_dir, capsys)
            assert line == f"{run_dir}/{expected}", (case_name, every_digest, line)
            shutil.rmtree(run_dir)
    stateful = len(payload["client_states"]) >= 2
    assert applied >= (27 if stateful else 15), applied


def test_a_body_pickled_with_protocol_5_is_one_line(checkpoints, tmp_path):
    source, _ = checkpoints("scaffold")
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    path = run_dir / "checkpoint.pt"
    header, payload = load_body(path)
    buffer = io.BytesIO()
    torch.save(payload, buffer, pickle_protocol=pickle.HIGHEST_PROTOCOL, _use_new_zipfile_serialization=False)
    del header["sha256"]
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    digest.update(buffer.getvalue())
    header["sha256"] = digest.hexdigest()
    path.write_bytes(MAGIC + json.dumps(header).encode() + b"\n" + buffer.getvalue())
    # In a process of its own: pytest would catch torch's warning before it reached stderr.
    resumed = subprocess.run([sys.executable, "-m", "rayfed", "run", "--resume", str(run_dir), "--quiet"],
                             capture_output=True, text=True)
    assert (resumed.returncode, resumed.stderr) == (
        2, f"rayfed: error: {path} is damaged: its body cannot be read (UnpicklingError)\n")


SPILLED_EDITS = {
    "a row's bytes changed, the shard's digest recomputed": (
        lambda rows, shard: rows.__setitem__(slice(0, 4), b"\x00\x00\x80\x7f"), False,
        "client {client}'s state does not match the SHA-256 recorded for it (another client's state, or edited "
        "since it was written)"),
    "NaN in a row, every digest recomputed": (
        lambda rows, shard: rows.__setitem__(slice(0, 4), b"\x00\x00\xc0\x7f"), True,
        "client {client}'s state: control holds NaN or infinity"),
    "a row's control flagged None": (
        lambda rows, shard: shard["nones"].__setitem__((0, 0), True), True,
        "client {client}'s state: control is None, expected a tensor of shape ({floats},) float32"),
    "a row moved to a client beyond N": (
        lambda rows, shard: shard["clients"].__setitem__(0, 12), True,
        "client 12 has a state, but data.num_clients=12 (clients 0-11)"),
}


@pytest.mark.parametrize("edit", list(SPILLED_EDITS))
def test_spilled_states_are_checked_row_by_row(tmp_path, capsys, edit):
    """SCAFFOLD's states spilled (engine.state_memory_mb=0): the checkpoint's shard copy is read
    row by row against the SHA-256 recorded for each row, its layout and its tensors' values."""
    from rayfed.engine.state_store import row_sha256
    from tests.checkpoint_damage import overrides
    config = rayfed.load_config(None, overrides("scaffold") + ["engine.state_memory_mb=0", "train.rounds=4"])
    run_dir = tmp_path / "run"
    rayfed.run(config, run_dir=run_dir, progress=False)
    # As if it had stopped after its checkpoint: metrics.jsonl, which says what is left, ends there.
    kept = read_checkpoint(run_dir).rounds_completed
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(b"".join(metrics.read_bytes().splitlines(keepends=True)[:kept]))
    (run_dir / "summary.json").unlink()
    change, every_digest, expected = SPILLED_EDITS[edit]

    def spoil(payload):
        shard = payload["state_shards"][0]
        path = run_dir / shard["file"]
        rows = bytearray(path.read_bytes())
        change(rows, shard)
        path.write_bytes(rows)
        shard["sha256"] = hashlib.sha256(rows).hexdigest()
        if every_digest:
            width = len(rows) // shard["rows"]
            shard["row_sha256"][0] = torch.from_numpy(row_sha256(bytes(rows[:width]), shard["nones"][0].numpy()).copy())

    _, payload = load_body(run_dir / "checkpoint.pt")
    client = payload["state_shards"][0]["clients"][0].item()
    floats = payload["server"]["state"].control.numel()
    rewrite(run_dir, spoil, every_digest)
    assert refused(run_dir, capsys) == f"{run_dir}/checkpoint.pt: " + expected.format(client=client, floats=floats)


def test_a_recovery_from_an_edited_checkpoint_stops_the_run_with_one_line(checkpoints, tmp_path):
    """The supervisor checks the checkpoint it recovers a server or worker from as a resume does."""
    from rayfed.checkpoint_content import Declared
    from rayfed.engine.supervisor import Supervisor
    from rayfed.errors import RunStopped
    from tests.checkpoint_damage import swap
    source, _ = checkpoints("scaffold")
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    rewrite(run_dir, swap)
    config = rayfed.load_config(run_dir / "config.yaml")
    supervisor = Supervisor.__new__(Supervisor)
    supervisor.run_dir, supervisor.round = run_dir, 4
    supervisor.declared = Declared(config, make_systems(config))
    with pytest.raises(RunStopped) as stopped:
        supervisor._last_checkpoint()
    assert stopped.value.status == "checkpoint_damaged"
    assert str(stopped.value).startswith(f"{run_dir}/checkpoint.pt: client ")
    assert str(stopped.value).endswith("; the run cannot recover from it and stopped in round 5")


def make_systems(config):
    import dataclasses
    from rayfed.api import load_data
    from rayfed.systems.clients import make_client_systems
    _, partition = load_data(config)
    return dataclasses.replace(make_client_systems(config), client_sizes=partition.sizes)
