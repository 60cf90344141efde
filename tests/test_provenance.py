"""What decides the bits is recorded with every result and checked on resume (rayfed.provenance), and
engine.cpu_isa pins the CPU kernels in the driver and in every Ray actor."""
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

import rayfed
from rayfed.checkpoint import read_checkpoint, write_checkpoint
from rayfed.cli import main
import rayfed.provenance
from rayfed.provenance import (CAPS, CPU_ISAS, DECIDING, INFORMATIVE, environment, first_difference, merged,
                               processor_isa, rayfed_code)
from tests.params_digest import DIGEST_FILE
from tests.test_checkpoint import ROUNDS, interrupted, snapshot
from tests.test_engine_equivalence import SYNTHETIC_MLP

ROOT = Path(__file__).parents[1]
LOCAL = SYNTHETIC_MLP + ["engine.backend=local"]
# What ATen runs here without a cap, and an instruction set below it and one above it (None: there is none).
NATURAL = torch.backends.cpu.get_cpu_capability().lower()
BELOW = {"avx512": "avx2", "avx2": "default"}.get(processor_isa())
ABOVE = {"default": "avx2", "avx2": "avx512"}.get(processor_isa())


def test_a_record_is_strings_the_deciding_fields_first_and_names_no_host():
    record = environment()
    assert list(record) == [*DECIDING, *INFORMATIVE]
    assert all(type(value) is str and value for value in record.values()), record
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["threads"] == str(torch.get_num_threads())
    assert record["torch"] == torch.__version__
    host = socket.gethostname()
    assert len(host) < 4 or host not in json.dumps(record)


def git(*arguments):
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True, check=True).stdout.strip()


def test_the_record_names_rayfed_s_commit_and_whether_its_package_differs_from_it(monkeypatch):
    """A study's results name the code that made them: from this checkout, its commit."""
    try:
        changes = " +changes" if git("status", "--porcelain", "--untracked-files=no", "--", "rayfed") else ""
        expected = f"{rayfed.__version__} (git {git('rev-parse', '--short=12', 'HEAD')}{changes})"
    except subprocess.CalledProcessError:       # a copy without .git, or one git refuses to read: the version alone
        expected = rayfed.__version__
    assert environment()["rayfed"] == expected

    def untracked(folder, *arguments):
        return "" if arguments[0] == "ls-files" else "0123456789ab"

    def no_git(folder, *arguments):
        raise FileNotFoundError("git")

    try:
        for fake in (untracked, no_git):        # a package in a virtual environment inside another checkout; no git
            monkeypatch.setattr(rayfed.provenance, "_git", fake)
            rayfed_code.cache_clear()
            assert rayfed_code() == rayfed.__version__
    finally:
        monkeypatch.undo()
        rayfed_code.cache_clear()


def test_processes_that_differ_are_named_with_their_values():
    same = {"cpu_capability": "AVX2", "torch": "2.1"}
    wider = {"cpu_capability": "AVX512", "torch": "2.1"}
    record = merged(same, [same, wider, wider, same, wider, same])
    assert record == {"cpu_capability": "AVX2 (server, workers 0, 3, 5); AVX512 (workers 1-2, 4)", "torch": "2.1"}
    assert merged(same, [same]) == same
    assert merged(same, [{**same, "gpu": "H100"}])["gpu"] == "none (server); H100 (worker 0)"


def test_a_resume_compares_only_the_fields_that_decide_the_bits():
    record = environment()
    assert first_difference(record, {**record, "processor": "elsewhere", "python": "3.99"}) is None
    assert first_difference(record, {**record, "threads": "8", "gpu": "H100"}) == ("threads", record["threads"], "8")
    older = {name: value for name, value in record.items() if name != "cpu_capability"}
    assert first_difference(older, {**record, "cpu_capability": "SVE256"}) is None


def test_the_caps_are_those_aten_mkl_and_onednn_read():
    assert list(CAPS) == list(CPU_ISAS)
    assert CAPS["avx2"] == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert rayfed.load_config(None, ["engine.cpu_isa=avx2"]).engine.cpu_isa == "avx2"
    with pytest.raises(rayfed.ConfigError, match=r"^engine.cpu_isa='sse4' is not one of: default, avx2, avx512$"):
        rayfed.load_config(None, ["engine.cpu_isa=sse4"])


@pytest.mark.skipif(BELOW is None, reason="no instruction set below this processor's to cap at")
def test_a_python_driver_must_start_with_the_caps(tmp_path, monkeypatch):
    """This process chose its kernels long ago: the caps set now would reach neither PyTorch, nor MKL, nor oneDNN."""
    config = rayfed.load_config(None, LOCAL + [f"engine.cpu_isa={BELOW}"])
    caps = " ".join(f"{name}={value}" for name, value in CAPS[BELOW].items())
    for name in CAPS[BELOW]:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(rayfed.ConfigError) as refused:
        rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    assert str(refused.value) == (f"engine.cpu_isa={BELOW} needs {caps} in the environment from the process's start "
                                  f"(PyTorch, MKL and oneDNN read them at their first computation): set them before "
                                  f"starting Python, or use `rayfed run`, which does")
    for name, value in CAPS[BELOW].items():
        monkeypatch.setenv(name, value)
    with pytest.raises(rayfed.ConfigError) as refused:
        rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    assert str(refused.value) == (f"engine.cpu_isa={BELOW}: this process computes with PyTorch's {NATURAL.upper()} "
                                  f"kernels, chosen at its first computation, before {caps} was in its environment: "
                                  f"set them before starting Python, or use `rayfed run`")
    assert not (tmp_path / "run").exists()


def test_a_cap_this_processor_has_and_this_process_runs_is_kept(tmp_path, monkeypatch):
    for name, value in CAPS[NATURAL].items():
        monkeypatch.setenv(name, value)
    result = rayfed.run(rayfed.load_config(None, LOCAL + ["train.rounds=1", f"engine.cpu_isa={NATURAL}"]),
                        run_dir=tmp_path / "run", progress=False)
    assert result.summary["environment"]["cpu_caps"] == " ".join(f"{n}={v}" for n, v in CAPS[NATURAL].items())
    assert result.summary["environment"]["mkl"].endswith(f", MKL_CBWR={CAPS[NATURAL]['MKL_CBWR']}")


@pytest.mark.skipif(ABOVE is None, reason="this processor has the widest instruction set")
def test_a_cap_above_the_processor_is_refused_before_the_command_starts_again(tmp_path, capsys):
    assert main(["run", *LOCAL, f"engine.cpu_isa={ABOVE}", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"rayfed: error: engine.cpu_isa={ABOVE}: this machine has a processor without "
                                       f"it (its best is {processor_isa()}); choose an instruction set every node "
                                       f"has\n")
    assert not (tmp_path / "run").exists()


def test_the_summary_and_every_checkpoint_record_what_decided_the_bits(tmp_path):
    result = rayfed.run(rayfed.load_config(None, LOCAL + ["train.rounds=3", "train.checkpoint_every=2"]),
                        run_dir=tmp_path / "run", progress=False)
    # The run's processes compute with engine.worker_cpus threads, whatever the driver's own count.
    expected = {**environment(), "threads": "1"}
    assert result.summary["environment"] == expected
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["environment"] == expected
    assert read_checkpoint(tmp_path / "run").environment == expected


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory):
    """A run stopped after round 5 whose checkpoint of round 4 says it was computed with other CPU kernels."""
    root = tmp_path_factory.mktemp("elsewhere")
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_dir = interrupted(root, LOCAL + ROUNDS, monkeypatch)
    checkpoint = read_checkpoint(run_dir)
    write_checkpoint(run_dir, dataclasses.replace(checkpoint, environment={**checkpoint.environment,
                                                                          "cpu_capability": "SVE256"}))
    return run_dir


def test_a_resume_where_the_kernels_differ_is_refused_in_one_line(tmp_path, capsys, elsewhere):
    run_dir = tmp_path / "run"
    shutil.copytree(elsewhere, run_dir)
    before = snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"rayfed: error: {run_dir / 'checkpoint.pt'} was written with cpu_capability 'SVE256', and this run has "
        f"{torch.backends.cpu.get_cpu_capability()!r}: the rounds left may not have an uninterrupted run's bits; to go "
        f"on anyway: rayfed run --resume {run_dir} --accept-environment (rayfed.resume(..., "
        f"accept_environment=True))\n")
    assert snapshot(run_dir) == before


def test_an_accepted_resume_where_the_kernels_differ_says_so_and_records_its_own(tmp_path, capsys, elsewhere):
    run_dir = tmp_path / "run"
    shutil.copytree(elsewhere, run_dir)
    assert main(["run", "--resume", str(run_dir), "--accept-environment", "--quiet"]) == 0
    assert capsys.readouterr().err == (
        f"rayfed: {run_dir / 'checkpoint.pt'} was written with cpu_capability 'SVE256', and this run has "
        f"{torch.backends.cpu.get_cpu_capability()!r}; going on, as accepted\n")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 7
    assert summary["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.slow
@pytest.mark.skipif(BELOW is None, reason="no instruction set below this processor's to cap at")
def test_engine_cpu_isa_gives_ray_workers_the_local_engines_capped_bits(tmp_path, ray_cluster):
    """The quick-start's first rounds with the cap: the local engine through `rayfed run` (which starts again with the
    caps), and the ray engine on the suite's Ray, whose processes started without them, so that its actors get
    them only from their runtime environment. Without the cap the bits differ, so the comparison can fail."""
    quick = ["train.rounds=3", "logging.callbacks=[tests.params_digest.ParamsDigest]"]
    uncapped = rayfed.run(rayfed.load_config(None, ["train.rounds=3", "engine.backend=local"]),
                          run_dir=tmp_path / "uncapped", progress=False)
    rayfed.release_actors()     # the CPUs they hold, for the command's workers
    runs = {"local": ["engine.backend=local"], "ray": [f"engine.address={ray.get_runtime_context().gcs_address}"]}
    for name, engine in runs.items():
        environment_without_caps = {key: value for key, value in os.environ.items() if key not in CAPS[BELOW]}
        completed = subprocess.run([sys.executable, "-m", "rayfed", "run", *quick, *engine, f"engine.cpu_isa={BELOW}",
                                    "--out", str(tmp_path / name), "--quiet"], cwd=ROOT, env=environment_without_caps,
                                   capture_output=True, text=True, timeout=600)
        assert completed.returncode == 0 and completed.stderr == "", completed.stderr
    digests = {name: (tmp_path / name / DIGEST_FILE).read_text() for name in runs}
    print(f"params' SHA-256 after 3 rounds: uncapped ({NATURAL}) "
          f"{hashlib.sha256(uncapped.params.numpy().tobytes()).hexdigest()}, engine.cpu_isa={BELOW}: {digests}")
    assert digests["local"] == digests["ray"] != hashlib.sha256(uncapped.params.numpy().tobytes()).hexdigest()
    on_ray = json.loads((tmp_path / "ray" / "summary.json").read_text())["environment"]
    # One value for the server and every worker: each computed with the capped kernels.
    assert on_ray["cpu_capability"] == BELOW.upper()
    assert on_ray["cpu_caps"] == " ".join(f"{name}={value}" for name, value in CAPS[BELOW].items())
    assert on_ray["mkl"].endswith(f", MKL_CBWR={CAPS[BELOW]['MKL_CBWR']}")
