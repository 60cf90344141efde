"""`rayfed report SWEEP_DIR` on a sweep directory whose trials are hand-made run directories:
the selected settings' mean ± std over seeds with the criterion stated, the grid without a
selection, the same selection recomputed by --select; and runs that stopped at their target."""
import json
import shutil
import statistics

import pytest
import yaml

from rayfed.cli import main
from rayfed.sweep.cli import SWEEP_FILE
from rayfed.sweep.spec import read_sweep
from tests.test_report import write_run

# test accuracy at rounds 2, 4, 6, 8 per (algorithm, lr_local) and seed
ACCURACY = {
    ("fedavg", 0.01): {0: [0.2, 0.4, 0.9, 0.5], 1: [0.1, 0.2, 0.3, 0.3], 2: [0.1, 0.2, 0.3, 0.4]},
    ("fedavg", 0.1): {0: [0.3, 0.5, 0.6, 0.7], 1: [0.2, 0.4, 0.55, 0.6], 2: [0.3, 0.5, 0.5, 0.65]},
    ("fedprox", 0.01): {0: [0.3, 0.5, 0.6, 0.55], 1: [0.3, 0.45, 0.5, 0.6], 2: [0.2, 0.4, 0.5, 0.5]},
    ("fedprox", 0.1): {0: [0.2, 0.3, 0.4, 0.5], 1: [0.2, 0.3, 0.5, 0.45], 2: [0.1, 0.2, 0.4, 0.6]},
}
# Means of the best accuracy over seeds: fedavg 0.533 (lr 0.01) < 0.65 (lr 0.1), fedprox 0.567 (lr 0.01) > 0.533.
SELECTED = {"fedavg": 0.1, "fedprox": 0.01}
GRID = {"algorithm.name": ["fedavg", "fedprox"], "algorithm.lr_local": [0.01, 0.1], "seed": [0, 1, 2]}


def expanded_sweep(folder, grid):
    """The sweep file s.yaml of `grid` in `folder`, expanded, and its sweep directory with sweep.yaml written."""
    (folder / "s.yaml").write_text(yaml.safe_dump({"base": {"train": {"rounds": 8, "eval_every": 2}},
                                                   "grid": grid}, sort_keys=False))
    sweep = read_sweep("s.yaml", [], folder / "base.yaml")
    out = folder / "out"
    out.mkdir()
    (out / SWEEP_FILE).write_text(sweep.describe())
    return sweep, out


@pytest.fixture
def sweep_dir(tmp_path, monkeypatch):
    """A finished sweep as `rayfed sweep` leaves it (sweep.yaml, trials/), before any --select."""
    monkeypatch.chdir(tmp_path)
    sweep, out = expanded_sweep(tmp_path, GRID)
    for trial in sweep.trials:
        point = dict(trial.point)
        key = (point["algorithm.name"], point["algorithm.lr_local"])
        write_run(out / "trials" / trial.name, point["seed"], ACCURACY[key][point["seed"]], algorithm=key[0],
                  lr_local=key[1], wall_time_s=5.0)
    return out


def cell(values):
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def expected_row(algorithm, lr):
    seeds = ACCURACY[algorithm, lr].values()
    best, final = cell([max(a) for a in seeds]), cell([a[-1] for a in seeds])
    return f"| {algorithm} | {lr} | 3 | {best} | {final} | 5.0 | finished |"


def report(*argv):
    return main(["report", *map(str, argv)])


def report_table(*argv):
    """One figure in one format, drawn in a fraction of the time: these reports are read for their tables."""
    return report(*argv, "--metric", "test_accuracy", "--format", "png")


def table_rows(text):
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_a_selected_sweep_reports_each_methods_selected_setting_over_its_seeds(sweep_dir, capsys):
    assert main(["sweep", "s.yaml", "--out", str(sweep_dir), "--select", "best_test_accuracy", "--quiet"]) == 0
    capsys.readouterr()
    selection = json.loads((sweep_dir / "selection.json").read_text())
    assert selection["metric"] == "best_test_accuracy" and selection["group_keys"] == ["algorithm.name"]
    assert selection["setting_keys"] == ["algorithm.lr_local"]
    assert [(row["group"], row["setting"], row["seed_values"]) for row in selection["groups"]] == [
        ({"algorithm.name": "fedavg"}, {"algorithm.lr_local": 0.1}, [0, 1, 2]),
        ({"algorithm.name": "fedprox"}, {"algorithm.lr_local": 0.01}, [0, 1, 2])]
    assert selection["groups"][0]["trials"] == [f"trials/algorithm.name=fedavg__algorithm.lr_local=0.1__seed={seed}"
                                                for seed in range(3)]
    assert selection["groups"][1]["mean_best_test_accuracy"] == pytest.approx((0.6 + 0.6 + 0.5) / 3)
    assert [row["seeds"] for row in selection["groups"][0]["compared"]] == [3, 3]
    assert (sweep_dir / "selection.md").read_text().startswith(
        "Selected per algorithm.name, the setting with the highest mean best_test_accuracy over its seeds")

    assert report(sweep_dir) == 0
    printed = capsys.readouterr().out
    assert "6 run(s) averaged in 2 group(s)." in printed
    assert ("Selected per algorithm.name, the setting with the highest mean best_test_accuracy over its seeds "
            "(each seed's summary.json, complete runs only; ties to the setting first in the grid), as rayfed "
            "sweep --select wrote it in selection.json. Settings compared per group: 2 of algorithm.lr_local in "
            f"{sweep_dir}.") in printed
    assert table_rows(printed) == [expected_row(algorithm, lr) for algorithm, lr in SELECTED.items()]
    assert "| algorithm.name | algorithm.lr_local | seeds | best test accuracy | final test accuracy |" in printed
    assert (sweep_dir / "report.md").read_text().startswith(printed.split("\nrayfed: wrote")[0])


def test_without_a_selection_file_the_grid_is_averaged_or_selected_again(sweep_dir, capsys):
    assert report_table(sweep_dir, "--out", sweep_dir / "grid") == 0
    printed = capsys.readouterr().out
    assert "12 run(s) averaged in 4 group(s)." in printed and "Not averaged" not in printed
    assert "the sweep varies algorithm.name, algorithm.lr_local; each row is one setting averaged over its seeds" \
        in printed
    assert table_rows(printed) == [expected_row(*key) for key in ACCURACY]

    (sweep_dir / "selection.md").write_text("written by an older rayfed\n")
    assert report_table(sweep_dir, "--select", "best_test_accuracy", "--out", sweep_dir / "selected") == 0
    printed = capsys.readouterr().out
    assert "chosen here (--select) from the trials' summary.json" in printed
    assert table_rows(printed) == [expected_row(algorithm, lr) for algorithm, lr in SELECTED.items()]
    assert not (sweep_dir / "selection.json").exists()     # the report does not write into the sweep

    assert report_table(sweep_dir, "--select", "final_test_accuracy", "--out", sweep_dir / "final") == 0
    # final accuracy means: fedavg 0.4 (lr 0.01) < 0.65; fedprox 0.55 (lr 0.01) = 0.55 (lr 0.1): the grid's first
    assert table_rows(capsys.readouterr().out) == [expected_row("fedavg", 0.1), expected_row("fedprox", 0.01)]

    assert report_table(sweep_dir, "--out", sweep_dir / "grid") == 0
    assert f"{sweep_dir / 'selection.md'} has no selection.json beside it" in capsys.readouterr().out


def test_an_explicit_group_averages_every_run_of_the_sweep_as_before(sweep_dir, capsys):
    assert report_table(sweep_dir, "--group", "algorithm.name", "--out", sweep_dir / "by_algorithm") == 0
    printed = capsys.readouterr().out
    assert "0 run(s) averaged in 0 group(s)." in printed and "algorithm.lr_local differs" in printed


def test_a_selection_can_stand_for_any_number_of_sweeps(sweep_dir, tmp_path, capsys):
    """Methods whose hyper-parameters differ are often swept apart, and reported together."""
    other = tmp_path / "other"
    shutil.copytree(sweep_dir, other)
    assert report_table(sweep_dir, other, "--select", "best_test_accuracy", "--out", tmp_path / "both") == 0
    printed = capsys.readouterr().out
    assert f"2 of algorithm.lr_local in {sweep_dir}; 2 of algorithm.lr_local in {other}" in printed
    assert "repeats seed" in printed        # the same runs twice are counted once


@pytest.mark.parametrize("setup, args, message", [
    (None, ["--select", "best_test_accuracy", "{tmp}/plain"],
     "--select chooses among a sweep's trials, and '{tmp}/plain' is no sweep directory"),
    ("garbled", ["{sweep}"], "selection.json is not a selection written by rayfed sweep --select"),
    ("missing_trial", ["{sweep}"], "selection.json names the trial trials/gone, which {sweep}/trials does not hold"),
    ("bad_sweep_yaml", ["{sweep}"], "sweep.yaml is not a sweep's description as rayfed sweep writes it"),
    (None, ["{sweep}", "--metric", "test_acc"],
     "--metric 'test_acc' is no numeric key of the runs' metrics.jsonl (they have bytes_down, bytes_up, "),
    (None, ["{sweep}", "--format", "png,jpg"], "--format 'jpg' is not one of png, pdf, svg"),
    (None, ["{sweep}", "--metric", "test_accuracy,"], "--metric takes comma-separated names, got 'test_accuracy,'"),
])
def test_bad_sweep_input_is_one_line_and_exit_2(sweep_dir, tmp_path, capsys, setup, args, message):
    write_run(tmp_path / "plain" / "run", 0, [0.1, 0.2, 0.3, 0.4])
    if setup == "garbled":
        (sweep_dir / "selection.json").write_text('{"metric": "best_test_accuracy"}')
    elif setup == "missing_trial":
        (sweep_dir / "selection.json").write_text(json.dumps({
            "metric": "m", "group_keys": [], "setting_keys": [], "criterion": "c",
            "groups": [{"group": {}, "setting": {}, "mean_m": 0.5, "compared": [], "trials": ["trials/gone"]}]}))
    elif setup == "bad_sweep_yaml":
        (sweep_dir / SWEEP_FILE).write_text("grid: [1, 2]\n")
    places = {"tmp": tmp_path, "sweep": sweep_dir}
    assert main(["report", *(arg.format(**places) for arg in args), "--out", str(tmp_path / "report")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("rayfed: error: ") and message.format(**places) in captured.err
    assert not (tmp_path / "report").exists()


TARGET = 0.5


def stopped(path, seed, accuracies, target_round, **kwargs):
    """A run that stopped at train.target_accuracy = TARGET: its metrics end at the target round."""
    rounds = target_round if target_round is not None else 8
    return write_run(path, seed, accuracies, rounds=rounds, target_accuracy=TARGET, target_round=target_round,
                     summary="reached_target" if target_round is not None else "finished", **kwargs)


def test_runs_that_stopped_at_their_target_count_their_own_target_rounds(tmp_path, capsys):
    stopped(tmp_path / "fedavg-0", 0, [0.3, 0.5], 4)
    stopped(tmp_path / "fedavg-1", 1, [0.2, 0.3, 0.55], 6)
    stopped(tmp_path / "fedprox-0", 0, [0.3, 0.6], 4, algorithm="fedprox")
    stopped(tmp_path / "fedprox-1", 1, [0.1, 0.2, 0.3, 0.4], None, algorithm="fedprox")   # never: ran all 8
    stopped(tmp_path / "fedprox-2", 2, [0.2, 0.5], 4, algorithm="fedprox")
    stopped(tmp_path / "fedmlb-0", 0, [0.2, 0.5, 0.6], 6, algorithm="fedmlb")      # its history says round 4
    write_run(tmp_path / "fedmlb-1", 1, [0.2, 0.5, 0.6], rounds=6, target_accuracy=TARGET, target_round=4,
              summary="reached_target", algorithm="fedmlb")                         # goes on after round 4
    write_run(tmp_path / "moon-0", 0, [0.2, 0.5, 0.6, 0.7], algorithm="moon")     # no target: none to count
    assert report_table(tmp_path, "--out", tmp_path / "out") == 0     # the target: the runs' train.target_accuracy
    printed = capsys.readouterr().out
    # fedavg: seed 0 reached 0.5 at round 4 (virtual s 4 * 1.0, 4 * 1100 bytes), seed 1 at round 6 (6 * 1.5, 6 * 1200)
    assert (f"| fedavg | 2 | {cell([0.5, 0.55])} | {cell([0.5, 0.55])} | {statistics.mean([4, 6]):.1f} ± "
            f"{statistics.stdev([4, 6]):.1f} | {statistics.mean([4.0, 9.0]):.1f} | "
            f"{statistics.mean([4400, 7200]) / 1000:.1f} KB | 10.0 | reached_target |") in printed
    assert "| 2 of 3 seeds | – | – | 10.0 | 1 finished, 2 reached_target |" in printed     # fedprox
    assert "| moon | 1 | 0.7000 ± – | 0.7000 ± – | – | – | – | 10.0 | finished |" in printed
    assert f"{tmp_path / 'fedmlb-0'}: summary.json's target_round 6 disagrees with metrics.jsonl, where round 4 " \
           f"first meets train.target_accuracy=0.5" in printed
    assert f"{tmp_path / 'fedmlb-1'}: metrics.jsonl goes on to round 6 after target_round 4" in printed
    assert "| rounds to 0.5 | virtual s to 0.5 | bytes to 0.5 |" in printed
    assert "each seed's first evaluated round at ≥ 0.5" in printed

    # seed 0 reaches 0.3 at round 2 (2.0 s, 2200 bytes), seed 1 at round 4 (6.0 s, 4800 bytes)
    fedavg = [tmp_path / "fedavg-0", tmp_path / "fedavg-1"]
    assert report_table(*fedavg, "--target", "0.3", "--out", tmp_path / "lower") == 0
    assert "| 3.0 ± 1.4 | 4.0 | 3.5 KB |" in capsys.readouterr().out
    assert report_table(*fedavg, "--target", "0.7", "--out", tmp_path / "higher") == 0
    assert "| unknown | unknown | unknown |" in capsys.readouterr().out   # they stopped at 0.5, before 0.7


def test_runs_that_did_not_stop_keep_the_seed_mean_curve(tmp_path, capsys):
    """A target in the config that no seed reached leaves whole histories: the papers' count applies."""
    stopped(tmp_path / "a", 0, [0.2, 0.3, 0.4, 0.45], None)
    stopped(tmp_path / "b", 1, [0.2, 0.3, 0.4, 0.45], None)
    assert report_table(tmp_path, "--target", "0.4", "--out", tmp_path / "out") == 0
    assert "| 6 | 7.5 | 6.9 KB |" in capsys.readouterr().out     # round 6: virtual s 6 and 9, 6600 and 7200 bytes


def test_groups_with_different_targets_get_a_target_column(tmp_path, capsys):
    stopped(tmp_path / "a", 0, [0.3, 0.5], 4)
    write_run(tmp_path / "b", 0, [0.3, 0.6], rounds=4, target_accuracy=0.6, target_round=4, summary="reached_target",
              algorithm="fedprox")
    assert report_table(tmp_path, "--out", tmp_path / "out") == 0
    printed = capsys.readouterr().out
    assert "| target | rounds to target | virtual s to target | bytes to target |" in printed
    assert "| 0.5 | 4.0 ± – |" in printed and "| 0.6 | 4.0 ± – |" in printed


# Methods with hyper-parameters of their own, in one sweep: (name, own key, its values, the best of them)
METHODS = (("fedavgm", "beta1", [0.5, 0.9], 0.9), ("fedprox", "mu", [0.001, 0.01, 0.1], 0.01),
           ("feddyn", "alpha", [0.01, 0.1], 0.1))
BEST_LR = {"fedavgm": 0.01, "fedprox": 0.1, "feddyn": 0.1}


def best_accuracy(name, own, lr, seed):
    best_own = next(best for method, _, _, best in METHODS if method == name)
    return 0.5 + 0.2 * (own == best_own) + 0.1 * (lr == BEST_LR[name]) + 0.01 * seed


@pytest.fixture
def methods_sweep(tmp_path, monkeypatch):
    """A sweep of three methods, each with its own key's sub-grid, as `rayfed sweep` leaves it."""
    monkeypatch.chdir(tmp_path)
    grid = {"algorithm": [{"name": name, key: values} for name, key, values, _ in METHODS],
            "algorithm.lr_local": [0.01, 0.1], "seed": [0, 1]}
    sweep, out = expanded_sweep(tmp_path, grid)
    for trial in sweep.trials:
        point = dict(trial.point)
        name, lr, seed = point["algorithm.name"], point["algorithm.lr_local"], point["seed"]
        key = next(key for method, key, _, _ in METHODS if method == name)
        best = best_accuracy(name, point[f"algorithm.{key}"], lr, seed)
        run = write_run(out / "trials" / trial.name, seed, [best - 0.3, best - 0.2, best, best - 0.05],
                        algorithm=name, lr_local=lr, wall_time_s=5.0)
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["algorithm"] = {"name": name, "lr_local": lr, key: point[f"algorithm.{key}"]}   # as rayfed writes it
        (run / "config.yaml").write_text(yaml.safe_dump(config))
    return out


def method_row(name, key, own, lr):
    best = [best_accuracy(name, own, lr, seed) for seed in (0, 1)]
    cells = {"beta1": "–", "mu": "–", "alpha": "–", key: str(own)}
    return (f"| {name} | {cells['beta1']} | {cells['mu']} | {cells['alpha']} | {lr} | 2 | {cell(best)} | "
            f"{cell([value - 0.05 for value in best])} | 5.0 | finished |")


def test_one_sweep_of_methods_with_keys_of_their_own_makes_one_table(methods_sweep, capsys):
    assert main(["sweep", "s.yaml", "--out", str(methods_sweep), "--select", "best_test_accuracy", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "| algorithm.name | algorithm.beta1 | algorithm.mu | algorithm.alpha | algorithm.lr_local | " \
           "mean best_test_accuracy | seeds |" in printed
    assert "| fedavgm | 0.9 | – | – | 0.01 | 0.8050 | 2 |" in printed
    selection = json.loads((methods_sweep / "selection.json").read_text())
    assert [(row["group"], row["setting"], len(row["compared"])) for row in selection["groups"]] == [
        ({"algorithm.name": name}, {"algorithm.beta1": None, "algorithm.mu": None, "algorithm.alpha": None,
                                    f"algorithm.{key}": best, "algorithm.lr_local": BEST_LR[name]}, 2 * len(values))
        for name, key, values, best in METHODS]

    expected = [method_row("fedavgm", "beta1", 0.9, 0.01), method_row("feddyn", "alpha", 0.1, 0.1),
                method_row("fedprox", "mu", 0.01, 0.1)]
    assert report_table(methods_sweep, "--out", methods_sweep / "selected") == 0
    printed = capsys.readouterr().out
    assert "6 run(s) averaged in 3 group(s)." in printed and "Not averaged" not in printed
    assert ("| algorithm.name | algorithm.beta1 | algorithm.mu | algorithm.alpha | algorithm.lr_local | seeds | "
            "best test accuracy |") in printed
    assert table_rows(printed) == expected
    assert "Settings compared per group: 6 of algorithm.beta1, algorithm.mu, algorithm.alpha, algorithm.lr_local" \
        in printed

    # the same choice from the trials alone, and without a selection every setting of every method
    (methods_sweep / "selection.json").unlink()
    assert report_table(methods_sweep, "--select", "best_test_accuracy", "--out", methods_sweep / "again") == 0
    assert table_rows(capsys.readouterr().out) == expected
    assert report_table(methods_sweep, "--out", methods_sweep / "grid") == 0
    printed = capsys.readouterr().out
    assert "28 run(s) averaged in 14 group(s)." in printed and "Not averaged" not in printed
    assert len(table_rows(printed)) == 14 and method_row("fedprox", "mu", 0.001, 0.01) in table_rows(printed)


def test_a_method_none_of_whose_trials_completed_leaves_no_column(methods_sweep, capsys):
    for summary in methods_sweep.glob("trials/algorithm.name=feddyn*/summary.json"):
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "status": "diverged"}))
    assert report_table(methods_sweep, "--select", "best_test_accuracy", "--out", methods_sweep / "selected") == 0
    printed = capsys.readouterr().out
    assert "| algorithm.name | algorithm.beta1 | algorithm.mu | algorithm.lr_local | seeds |" in printed
    assert [row.split(" | ")[:4] for row in table_rows(printed)] == [["| fedavgm", "0.9", "–", "0.01"],
                                                                    ["| fedprox", "–", "0.01", "0.1"]]
