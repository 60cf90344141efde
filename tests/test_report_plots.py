"""The report's figures: any metrics.jsonl key on any of the three x axes, log scales, PNG and PDF,
the legend beside the curves, and 16 methods told apart by colour, dashes and markers."""
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

from rayfed.cli import main
from rayfed.report.groups import group_runs
from rayfed.report.plots import curve_style, draw
from rayfed.report.runs import find_run_dirs, read_config, read_run
from rayfed.report.stats import group_stats
from tests.test_report import EVAL_ROUNDS, FEDAVG, write_run

METHODS = 16


@pytest.fixture
def runs_dir(tmp_path):
    for seed, accuracies in FEDAVG.items():
        write_run(tmp_path / "runs" / f"fedavg-{seed}", seed, accuracies)
    write_run(tmp_path / "runs" / "fedprox-0", 0, [0.1, 0.2, 0.3, 0.4], algorithm="fedprox")
    return tmp_path / "runs"


def stats_of(path, keys=("algorithm.name",)):
    runs = [read_run(run, read_config(run)) for run in find_run_dirs([str(path)])]
    return [group_stats(group, None) for group in group_runs(runs, list(keys))]


def test_figures_of_chosen_metrics_in_png_pdf_and_svg_with_log_axes(runs_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["report", str(runs_dir), "--metric", "test_loss,bytes_up", "--format", "png,pdf,svg",
                 "--x", "bytes", "--log-x", "--log-y", "--out", str(out)]) == 0
    assert "wrote report.md, test_loss.png, test_loss.pdf, test_loss.svg, bytes_up.png" in capsys.readouterr().out
    for metric in ("test_loss", "bytes_up"):
        assert (out / f"{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{metric}.pdf").read_bytes()[:5] == b"%PDF-"
        assert b"<svg" in (out / f"{metric}.svg").read_bytes()[:1000]
    report = (out / "report.md").read_text()
    assert "![test_loss](test_loss.png)" in report and ".pdf" not in report and ".svg" not in report
    assert not (out / "test_accuracy.png").exists()


def test_the_same_curves_give_the_same_pdf_bytes(runs_dir, tmp_path):
    """Regenerated figures of unchanged runs are no change in git."""
    for name in ("a", "b"):
        assert main(["report", str(runs_dir), "--format", "pdf", "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / "a" / "test_accuracy.pdf").read_bytes() == (tmp_path / "b" / "test_accuracy.pdf").read_bytes()


@pytest.mark.parametrize("x, column", [("round", "rounds"), ("virtual_time_s", "virtual_time_s"),
                                       ("bytes", "cumulative_bytes")])
def test_each_x_axis_is_the_seed_mean_of_that_quantity(runs_dir, x, column):
    fedavg, _ = stats_of(runs_dir)
    figure = draw("test_accuracy", ["algorithm.name"], [fedavg], x, log_y=(x == "round"))
    line, = figure.axes[0].get_lines()
    at = [round - 1 for round in EVAL_ROUNDS]
    expected = np.mean([getattr(run, column)[at] for run in fedavg.group.runs], axis=0)
    np.testing.assert_allclose(line.get_xdata(), expected)
    np.testing.assert_allclose(line.get_ydata(), np.mean(list(FEDAVG.values()), axis=0))
    assert figure.axes[0].get_yscale() == ("log" if x == "round" else "linear")


def test_sixteen_methods_are_told_apart_and_the_legend_is_beside_the_curves(tmp_path):
    for index in range(METHODS):
        write_run(tmp_path / f"method{index:02d}", 0, [0.1 + index / 100, 0.2, 0.3, 0.4], algorithm=f"m{index:02d}")
    stats = stats_of(tmp_path)
    figure = draw("test_accuracy", ["algorithm.name"], stats, "round")
    lines = figure.axes[0].get_lines()
    assert len({(to_hex(line.get_color()), line.get_linestyle(), line.get_marker()) for line in lines}) == METHODS
    assert len({(style["color"], style["linestyle"]) for style in map(curve_style, range(METHODS))}) == METHODS
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    legend, axes = figure.axes[0].get_legend(), figure.axes[0].get_window_extent(renderer)
    box = legend.get_window_extent(renderer)
    assert box.x0 > axes.x1 and box.y1 <= axes.y1 + 1          # right of the axes, from their top
    assert [text.get_text() for text in legend.get_texts()] == [f"m{index:02d}" for index in range(METHODS)]
    assert figure.get_tightbbox(renderer).x1 * figure.dpi >= box.x1 - 1     # the saved canvas holds it


def test_an_accuracy_band_stays_within_0_and_1(tmp_path):
    write_run(tmp_path / "a", 0, [0.95, 0.95, 0.95, 0.95])
    write_run(tmp_path / "b", 1, [0.05, 0.05, 0.05, 0.95])
    stats = stats_of(tmp_path)
    band, = draw("test_accuracy", ["algorithm.name"], stats, "round").axes[0].collections
    heights = band.get_paths()[0].vertices[:, 1]
    assert heights.min() == pytest.approx(0) and heights.max() == pytest.approx(1)    # 0.5 ± 0.64 at rounds 2-6
