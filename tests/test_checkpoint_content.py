"""A checkpoint is checked by its content, not only by its digest: every edit a tool could make
while recomputing checkpoint.pt's digest (tests/checkpoint_damage.py) is refused on resume with one
line naming the field, exit 2, the run directory unchanged, for every registered algorithm and a
plugin's; the undamaged checkpoint resumes to the bits of the uninterrupted run."""
import hashlib
import io
import pickle
import shutil

import pytest
import torch

import rayfed
from rayfed.checkpoint import MAGIC
from rayfed.cli import main
from tests.checkpoint_damage import CASES, PLUGIN, algorithms, build, load_body, rewrite
from tests.test_engine_equivalence import assert_same_run
from tests.test_plugins import forget_plugins

PLUGIN_ALGORITHM = "drift_fedavg"


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
    assert applied >= (25 if stateful else 15), applied
