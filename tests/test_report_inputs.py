"""`rayfed report` on run and sweep directories whose files once ended in a traceback, a hang or
an exhausted memory: a run directory that cannot be read is one line under "Not averaged" (the
other runs are reported), a sweep's own file that cannot be read is one line and exit code 2."""
import os
import signal
import warnings

import pytest

from rayfed.cli import main
from tests.test_report import FEDAVG, write_run
from tests.test_report_sweep import report_table


@pytest.fixture
def no_hang():
    """A read that blocks (a FIFO without a writer) fails the test instead of hanging it."""
    def timeout(signum, frame):
        raise TimeoutError("the report hung")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def left_out(text):
    return [line for line in text[text.index("## Not averaged"):].splitlines() if line.startswith("- ")]


DEEP_YAML = "seed: " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_JSON = '{"round": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
BROKEN_RUNS = {
    "deep config": ("config.yaml", DEEP_YAML, "config.yaml is not valid YAML at line 1, column 38: nested more than "
                                              "32 levels deep"),
    "set in config": ("config.yaml", "seed: !!set {1, 2}\n",
                      "config.yaml is not valid YAML at line 1, column 7: a set (!!set) is not a value rayfed reads"),
    "repeated key": ("config.yaml", "seed: 1\nalgorithm: {name: fedavg}\nseed: 2\n",
                     "config.yaml is not valid YAML at line 3, column 1: the key 'seed' is given twice (first at "
                     "line 1)"),
    "deep metrics": ("metrics.jsonl", DEEP_JSON, "metrics.jsonl line 1 is nested more than 32 levels deep"),
    "33-deep metrics": ("metrics.jsonl", '{"round": 1, "x": ' + "[" * 32 + "]" * 32 + "}\n",
                        "metrics.jsonl line 1 is nested more than 32 levels deep"),
    "10**400 bytes": ("metrics.jsonl", '{"round": 1, "test_accuracy": 0.5, "bytes_up": 1' + "0" * 400 + "}\n",
                      "metrics.jsonl line 1 is not strict JSON: an integer of 401 digits, beyond 64 bits"),
    "1e400 accuracy": ("metrics.jsonl", '{"round": 1, "test_accuracy": 1e400}\n',
                       "metrics.jsonl line 1 is not strict JSON: '1e400' is beyond a double's range"),
    "fifo config": ("config.yaml", "fifo", "config.yaml is not a regular file"),
    "fifo metrics": ("metrics.jsonl", "fifo", "metrics.jsonl is not a regular file"),
    "/dev/zero config": ("config.yaml", "/dev/zero", "config.yaml is not a regular file"),
    "/dev/zero metrics": ("metrics.jsonl", "/dev/zero", "metrics.jsonl is not a regular file"),
}


def replace(path, content):
    """`path` becomes `content`: text, a FIFO ("fifo") or a link to /dev/zero ("/dev/zero")."""
    path.unlink(missing_ok=True)
    if content == "fifo":
        os.mkfifo(path)
    elif content == "/dev/zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(content)


@pytest.mark.parametrize("name, content, reason", BROKEN_RUNS.values(), ids=BROKEN_RUNS)
def test_a_run_directory_that_cannot_be_read_is_one_line_and_the_rest_is_reported(tmp_path, capsys, no_hang,
                                                                                  name, content, reason):
    for seed in (0, 1):
        write_run(tmp_path / f"good{seed}", seed, FEDAVG[seed])
    broken = write_run(tmp_path / "broken", 2, FEDAVG[2]) / name
    replace(broken, content)
    assert report_table(tmp_path, "--out", tmp_path / "out") == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "2 run(s) averaged in 1 group(s)." in captured.out and "| fedavg | 2 |" in captured.out
    assert left_out(captured.out) == [f"- {tmp_path / 'broken'}: {reason}"]


def test_a_damaged_summary_reads_as_none_and_the_run_as_incomplete(tmp_path, capsys, no_hang):
    write_run(tmp_path / "a", 0, FEDAVG[0])
    write_run(tmp_path / "b", 1, FEDAVG[1])
    (tmp_path / "b" / "summary.json").write_text('{"status": "finished", "wall_time_s": 1' + "0" * 400 + "}")
    (tmp_path / "a" / "summary.json").unlink()
    os.mkfifo(tmp_path / "a" / "summary.json")
    assert report_table(tmp_path, "--out", tmp_path / "out") == 0
    assert "| fedavg | 2 | 0.6750 ± 0.1768 | 0.6500 ± 0.1414 | – | incomplete |" in capsys.readouterr().out


def test_statistics_beyond_a_double_are_one_line_and_no_warning(tmp_path, capsys):
    """Seeds whose accuracy is 1e308 once gave `inf ± inf` and six lines of numpy's warnings."""
    for seed in range(3):
        write_run(tmp_path / f"huge{seed}", seed, [1e308] * 4)
        write_run(tmp_path / f"fine{seed}", seed, FEDAVG[seed], algorithm="fedprox")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report_table(tmp_path, "--out", tmp_path / "out", "--target", "0.5") == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "| fedavg | 3 | not finite | not finite |" in captured.out
    assert "| fedprox | 3 | 0.6167 ± 0.1607 | 0.6000 ± 0.1323 |" in captured.out
    assert left_out(captured.out) == ["- algorithm.name=fedavg: best and final test accuracy not finite: its mean or "
                                      "std over seeds is beyond a double's range, though each seed's value is finite"]


def test_a_400_digit_group_value_sorts(tmp_path, capsys):
    write_run(tmp_path / "a", 0, FEDAVG[0])
    config = (tmp_path / "a" / "config.yaml").read_text().replace("lr_local: 0.02", "lr_local: 1" + "0" * 400)
    (tmp_path / "a" / "config.yaml").write_text(config)
    write_run(tmp_path / "b", 0, FEDAVG[1])
    assert report_table(tmp_path, "--group", "algorithm.lr_local", "--out", tmp_path / "out") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.02 |") or
            line.startswith("| 1000")]
    assert [row[:8] for row in rows] == ["| 0.02 |", "| 100000"]


@pytest.fixture
def sweep_dir(tmp_path):
    out = tmp_path / "sweep"
    (out / "trials").mkdir(parents=True)
    (out / "sweep.yaml").write_text("base: ''\ngrid: {seed: [0, 1]}\noverrides: []\n")
    for seed in (0, 1):
        write_run(out / "trials" / f"seed={seed}", seed, FEDAVG[seed])
    return out


BROKEN_SWEEPS = {
    "deep sweep.yaml": ("sweep.yaml", "grid: " + "[" * 5000 + "]" * 5000 + "\n",
                        "sweep.yaml is not valid YAML at line 1, column 38: nested more than 32 levels deep"),
    "repeated grid": ("sweep.yaml", "grid: {seed: [0]}\ngrid: {seed: [0, 1]}\n",
                      "sweep.yaml is not valid YAML at line 2, column 1: the key 'grid' is given twice (first at "
                      "line 1)"),
    "fifo sweep.yaml": ("sweep.yaml", "fifo", "sweep.yaml is not a regular file"),
    "deep selection": ("selection.json", "[" * 100_000 + "]" * 100_000, "selection.json is nested more than 32 "
                                                                        "levels deep"),
    "fifo selection": ("selection.json", "fifo", "selection.json is not a regular file"),
    "/dev/zero selection": ("selection.json", "/dev/zero", "selection.json is not a regular file"),
}


@pytest.mark.parametrize("name, content, message", BROKEN_SWEEPS.values(), ids=BROKEN_SWEEPS)
def test_a_sweep_file_that_cannot_be_read_is_one_line_and_exit_2(sweep_dir, tmp_path, capsys, no_hang,
                                                                 name, content, message):
    replace(sweep_dir / name, content)
    assert main(["report", str(sweep_dir), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"rayfed: error: {sweep_dir}/{message}\n"
    assert not (tmp_path / "out").exists()

