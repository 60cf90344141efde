"""A CPU estimate of full/table1_cifar100_vgg11_*.yaml where `rayfed sweep --plan` is too slow to calibrate: its 3
rounds a method of VGG-11 take tens of minutes here. Times, on random inputs of CIFAR's shape and one torch thread,
one client's local training (I = 5 steps of B = 64) with FedAvg's plain steps and with GradMA-W's QP-corrected ones,
and the evaluation of a 1,000-image batch; a round is then S clients' training plus 10 such batches (CIFAR-100's
10,000 test images), and a sweep is its trials x T rounds of it, 2 trials at a time as `rayfed sweep` runs them on
2 cores. Methods whose local step is one gradient pass are costed at FedAvg's step, the others (GradMA-W, GradMA;
MOON(M) and FedMLB(M), which make 2-3 passes a step) at GradMA-W's: a bracket, not the plan's per-method figure.

    python experiments/gradma/full/vgg11_round_cost.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench_costs import local_training_times  # noqa: E402  (the script beside this folder)

from rayfed.models import build_model  # noqa: E402

ROUNDS = 2000
TEST_IMAGES = 10_000
EVAL_BATCH = 1_000
# full/table1_*.yaml: trials whose local step is one gradient pass, and those with more (GradMA-W, GradMA, MOON,
# MOONM, FedMLB, FedMLBM).
ONE_PASS_TRIALS = 1404 - (27 + 243 + 27 + 81 + 27 + 81)
MULTI_PASS_TRIALS = 27 + 243 + 27 + 81 + 27 + 81
SLOTS = 2


def eval_batch_seconds() -> float:
    model = build_model("vgg11", (3, 32, 32), 100).eval()
    inputs = torch.randn(EVAL_BATCH, 3, 32, 32)
    with torch.no_grad():
        started = time.perf_counter()
        model(inputs)
        return time.perf_counter() - started


def main() -> None:
    torch.set_num_threads(1)
    num_params, train = local_training_times("vgg11", (3, 32, 32), repeats=1)
    evaluation = eval_batch_seconds() * TEST_IMAGES / EVAL_BATCH
    print(f"VGG-11 (d = {num_params}), one thread: a client's I = 5 steps of B = 64: FedAvg {train['fedavg']:.1f} s, "
          f"GradMA-W {train['gradma_w']:.1f} s; evaluation of {TEST_IMAGES} images {evaluation:.1f} s")
    print("| S | s/round, one pass a step | s/round, GradMA-W's steps | sweep estimate (T = 2000, 2 at a time) |")
    print("|---|---|---|---|")
    for clients in (5, 10, 50):
        one = clients * train["fedavg"] + evaluation
        multi = clients * train["gradma_w"] + evaluation
        total = (ONE_PASS_TRIALS * one + MULTI_PASS_TRIALS * multi) * ROUNDS / SLOTS
        print(f"| {clients} | {one:.0f} | {multi:.0f} | {total / 86400 / 365:.1f} years |")


if __name__ == "__main__":
    main()
