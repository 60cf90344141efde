"""`rayfed report` on hand-made run directories (config.yaml, metrics.jsonl, summary.json with
chosen numbers; nothing is trained), against values worked out by hand."""
import json
import math

import numpy as np
import pytest
import yaml
from matplotlib.image import imread

from rayfed.cli import main
from rayfed.report.cli import report_command
from rayfed.report.groups import group_runs
from rayfed.report.runs import find_run_dirs, read_config, read_run
from rayfed.report.stats import group_stats

EVAL_ROUNDS = (2, 4, 6, 8)
# test accuracy at EVAL_ROUNDS per seed. The seed-mean curve (0.25, 0.367, 0.55, 0.6) first reaches
# 0.5 at round 6, while the seeds themselves first reach it at rounds 4, 8 and 8.
FEDAVG = {0: [0.45, 0.6, 0.8, 0.75], 1: [0.1, 0.2, 0.45, 0.55], 2: [0.2, 0.3, 0.4, 0.5]}
NEVER = [0.1, 0.2, 0.3, 0.4]


def write_run(path, seed, accuracies, algorithm="fedavg", dataset="synthetic", lr_local=0.02, backend="ray",
              data_root="./data", rounds=8, summary="finished", wall_time_s=10.0, target_accuracy=None,
              target_round=None):
    """Round r moves 100 (seed + 1) bytes up and 1000 down and ends at virtual second r (1 + seed / 2);
    `accuracies` are the test accuracies of the EVAL_ROUNDS up to `rounds`."""
    path.mkdir(parents=True)
    config = {"seed": seed, "data": {"dataset": dataset, "root": data_root, "num_clients": 100},
              "model": {"name": "logreg", "hidden_sizes": [200, 100]},
              "algorithm": {"name": algorithm, "lr_local": lr_local, "beta1": None},
              "train": {"rounds": 8, "eval_every": 2, "target_accuracy": target_accuracy},
              "engine": {"backend": backend, "num_workers": 2}, "logging": {"tensorboard": False}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for round in range(1, rounds + 1):
        metrics = {"round": round, "train_loss": 2.0 / round + seed / 10, "num_participants": 10,
                   "bytes_up": 100 * (seed + 1), "bytes_down": 1000, "virtual_time_s": round * (1 + seed / 2),
                   "wall_time_s": round / 10, "phase_s": {"train": 0.01}}
        if round in EVAL_ROUNDS:
            metrics.update(test_loss=1.0, test_accuracy=accuracies[EVAL_ROUNDS.index(round)])
        lines.append(json.dumps(metrics))
    (path / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if summary is not None:
        evaluated = accuracies[:len([r for r in EVAL_ROUNDS if r <= rounds])]
        record = {"status": summary, "wall_time_s": wall_time_s, "best_test_accuracy": max(evaluated),
                  "final_test_accuracy": evaluated[-1], "rounds_completed": rounds}
        if target_round is not None:
            record["target_round"] = target_round
        (path / "summary.json").write_text(json.dumps(record))
    return path


@pytest.fixture
def sweep(tmp_path):
    """Run directories at different depths; seed 1 ran on the local engine and seed 2 read its data
    from elsewhere, which changes no maths."""
    root = tmp_path / "sweep"
    for seed, accuracies in FEDAVG.items():
        write_run(root / "fedavg" / "trials" / f"seed{seed}", seed, accuracies, backend="local" if seed == 1 else "ray",
                  data_root="/mnt/data" if seed == 2 else "./data", wall_time_s=10.0 * (seed + 1))
    write_run(root / "fedprox-seed0", 0, NEVER, algorithm="fedprox")
    return root


def stats_of(*dirs, keys=("algorithm.name",), target=0.5):
    runs = [read_run(path, read_config(path)) for path in find_run_dirs([str(d) for d in dirs])]
    groups = group_runs(runs, list(keys))
    return groups, [group_stats(group, target) for group in groups if not group.mismatches]


def sample_std(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_group_numbers_are_the_hand_computed_ones(sweep):
    _, (fedavg, fedprox) = stats_of(sweep)
    assert fedavg.group.values == ("fedavg",) and [run.seed for run in fedavg.group.runs] == [0, 1, 2]
    assert fedavg.best.mean == pytest.approx((0.8 + 0.55 + 0.5) / 3)
    assert fedavg.best.std == pytest.approx(sample_std([0.8, 0.55, 0.5]))
    assert fedavg.final.mean == pytest.approx(0.6)
    assert fedavg.final.std == pytest.approx(math.sqrt((0.15 ** 2 + 0.05 ** 2 + 0.1 ** 2) / 2))
    assert fedavg.reached.round == 6    # on the seed-mean curve, not any seed's own round (4, 8, 8)
    assert fedavg.reached.virtual_time_s == pytest.approx((6 * 1.0 + 6 * 1.5 + 6 * 2.0) / 3)
    assert fedavg.reached.bytes == pytest.approx((6 * 1100 + 6 * 1200 + 6 * 1300) / 3)
    assert fedavg.wall_time_s == pytest.approx(20.0)
    assert fedprox.reached is None and math.isnan(fedprox.best.std) and fedprox.best.mean == pytest.approx(0.4)


def test_table_rows_render_mean_std_target_and_never(sweep, tmp_path, capsys):
    assert report_command([str(sweep)], ["algorithm.name"], 0.5, "round", str(tmp_path / "out")) == 0
    printed = capsys.readouterr().out
    assert ("| algorithm.name | seeds | best test accuracy | final test accuracy | rounds to 0.5 | "
            "virtual s to 0.5 | bytes to 0.5 | wall s per run | status |") in printed
    assert "| fedavg | 3 | 0.6167 ± 0.1607 | 0.6000 ± 0.1323 | 6 | 9.0 | 7.2 KB | 20.0 | finished |" in printed
    assert "| fedprox | 1 | 0.4000 ± – | 0.4000 ± – | never | never | never | 10.0 | finished |" in printed
    assert printed.index("| fedavg |") < printed.index("| fedprox |")
    assert "ddof = 1" in printed and "Not averaged" not in printed
    assert (tmp_path / "out" / "report.md").read_text().startswith(printed.split("\nrayfed: wrote")[0])


def test_mismatched_and_broken_runs_are_listed_not_averaged(sweep, capsys):
    write_run(sweep / "gradma-a", 0, FEDAVG[0], algorithm="gradma", dataset="synthetic")
    write_run(sweep / "gradma-b", 0, FEDAVG[1], algorithm="gradma", dataset="mnist")     # no repeat of seed 0
    write_run(sweep / "fedavgm-a", 0, FEDAVG[0], algorithm="fedavgm", lr_local=0.02)
    write_run(sweep / "fedavgm-b", 1, FEDAVG[1], algorithm="fedavgm", lr_local=0.1)
    write_run(sweep / "mifa-a", 0, FEDAVG[0], algorithm="mifa")
    write_run(sweep / "mifa-b", 1, FEDAVG[1][:2], algorithm="mifa", rounds=4, summary=None)  # cut off
    (write_run(sweep / "no-metrics", 3, NEVER) / "metrics.jsonl").unlink()
    (write_run(sweep / "empty-metrics", 4, NEVER) / "metrics.jsonl").write_text("")
    (write_run(sweep / "nan-metrics", 5, NEVER) / "metrics.jsonl").write_text('{"round": 1, "train_loss": NaN}\n')
    (write_run(sweep / "untested", 6, NEVER) / "metrics.jsonl").write_text('{"round": 1, "train_loss": 1.0}\n')
    assert report_command([str(sweep)], ["algorithm.name"], 0.5, "round", None) == 0
    printed = capsys.readouterr().out
    left_out = printed[printed.index("## Not averaged"):]
    assert f"algorithm.name=gradma: not averaged, data.dataset differs: mnist ({sweep / 'gradma-b'}); " \
           f"synthetic ({sweep / 'gradma-a'})" in left_out
    assert f"algorithm.name=fedavgm: not averaged, algorithm.lr_local differs: 0.02 ({sweep / 'fedavgm-a'}); " \
           f"0.1 ({sweep / 'fedavgm-b'})" in left_out
    assert f"algorithm.name=mifa: not averaged, rounds or evaluated rounds differ: 4 rounds, evaluated at 2, 4 " \
           f"({sweep / 'mifa-b'}); 8 rounds, evaluated at 2, 4, 6, 8 ({sweep / 'mifa-a'})" in left_out
    assert f"{sweep / 'no-metrics'}: no metrics.jsonl" in left_out
    assert f"{sweep / 'empty-metrics'}: metrics.jsonl is empty" in left_out
    assert f"{sweep / 'nan-metrics'}: metrics.jsonl line 1 is not strict JSON: NaN is not JSON" in left_out
    assert f"{sweep / 'untested'}: metrics.jsonl has no test_accuracy" in left_out
    assert "repeats seed" not in left_out
    rows = [line for line in printed.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| fedavg", "| fedprox"]    # the rest are not averaged
    assert "| fedavg | 3 |" in printed     # the broken runs (fedavg, seeds 3 to 6) did not enter its mean
    assert (sweep / "report.md").is_file()     # one DIR: the report goes into it


def test_a_repeated_seed_is_counted_once_keeping_the_finished_run(tmp_path):
    write_run(tmp_path / "a-rerun", 0, [0.9] * 4, summary="interrupted")
    write_run(tmp_path / "b", 0, FEDAVG[0])
    write_run(tmp_path / "c", 1, FEDAVG[1])
    [group], [stats] = stats_of(tmp_path, target=None)
    assert [run.path.name for run in group.runs] == ["b", "c"]
    assert group.duplicates == [f"{tmp_path / 'a-rerun'} repeats seed 0 of {tmp_path / 'b'}; counted once"]
    assert stats.best.mean == pytest.approx((0.8 + 0.55) / 2) and stats.reached is None


def test_a_run_without_summary_is_incomplete_and_has_no_wall_time(tmp_path, capsys):
    write_run(tmp_path / "a", 0, FEDAVG[0], wall_time_s=12.0)
    write_run(tmp_path / "b", 1, FEDAVG[1], summary=None)
    assert report_command([str(tmp_path)], ["algorithm.name"], None, "round", None) == 0
    assert "| fedavg | 2 | 0.6750 ± 0.1768 | 0.6500 ± 0.1414 | 12.0 | 1 finished, 1 incomplete |" \
           in capsys.readouterr().out


@pytest.mark.parametrize("x", ["round", "virtual_time_s", "bytes"])
def test_plots_are_non_trivial_pngs_and_pdfs(sweep, tmp_path, x):
    assert report_command([str(sweep)], ["algorithm.name", "data.dataset"], 0.5, x, str(tmp_path / "out")) == 0
    for name in ("test_accuracy.png", "train_loss.png"):
        path = tmp_path / "out" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
        assert np.var(imread(path)[..., :3]) > 1e-3     # not a blank canvas
        assert f"![{path.stem}]({name})" in (tmp_path / "out" / "report.md").read_text()
        assert path.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"


def test_cli_prints_the_table_and_writes_report_md(sweep, tmp_path, capsys):
    out = tmp_path / "reports" / "first"
    assert main(["report", str(sweep), "--target", "0.5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| fedavg | 3 | 0.6167 ± 0.1607 |" in printed and f"into {out}" in printed
    assert "| fedavg | 3 | 0.6167 ± 0.1607 |" in (out / "report.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["missing"], "'{tmp}/missing' is not a directory"),
    (["empty"], "no run directories"),
    (["sweep", "--group", "algorithm.nme"], "--group key 'algorithm.nme' is in no run's config.yaml"),
    (["sweep", "--target", "50"], "--target is a test accuracy as a fraction in [0, 1], got 50.0"),
])
def test_cli_bad_input_is_one_line_and_exit_2(sweep, tmp_path, capsys, args, message):
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    argv = ["report", *(str(tmp_path / arg) if i == 0 else arg for i, arg in enumerate(args)),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("rayfed: error: ") and message.format(tmp=tmp_path) in captured.err
    assert not (tmp_path / "out").exists()
