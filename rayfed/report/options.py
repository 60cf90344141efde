"""The options of `rayfed report`, kept apart from the report's code so that building the command
line parser imports neither numpy nor matplotlib."""
from __future__ import annotations

import argparse

SELECTION_METRICS = ("best_test_accuracy", "final_test_accuracy")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", metavar="DIR",
                        help="run directories, directories holding them, or sweep directories (rayfed sweep --out)")
    parser.add_argument("--group", metavar="KEY", nargs="+",
                        help="config keys whose values make a group; runs in a group differ by seed (default: "
                             "for sweep directories the keys the sweep varies, with --select or a selection.json "
                             "the selection's groups; else algorithm.name)")
    parser.add_argument("--select", metavar="METRIC", choices=SELECTION_METRICS,
                        help="in sweep directories, report per --group (default algorithm.name) the setting with "
                             "the best mean over seeds of METRIC, as rayfed sweep --select chooses it: "
                             "best_test_accuracy or final_test_accuracy (default: the sweep's selection.json)")
    parser.add_argument("--target", metavar="ACC", type=float,
                        help="test accuracy whose first reaching is reported (default: the runs' "
                             "train.target_accuracy, where a group's runs share one)")
    parser.add_argument("--metric", metavar="KEY[,KEY...]", default="test_accuracy,train_loss",
                        help="the metrics.jsonl keys to plot, one figure each (default test_accuracy,train_loss)")
    parser.add_argument("--x", choices=("round", "virtual_time_s", "bytes"), default="round",
                        help="the plots' x axis (default round)")
    parser.add_argument("--log-x", action="store_true", help="a logarithmic x axis")
    parser.add_argument("--log-y", action="store_true", help="a logarithmic y axis (losses)")
    parser.add_argument("--format", metavar="FORMAT[,FORMAT...]", default="png,pdf",
                        help="the plots' file formats, from png, pdf and svg (default png,pdf)")
    parser.add_argument("--out", metavar="DIR",
                        help="where report.md and the plots go (default: the one DIR given, else ./report)")
