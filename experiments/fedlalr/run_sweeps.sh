#!/usr/bin/env bash
# Runs one stage of the measured comparison, one sweep at a time, from the repository root:
#   bash experiments/fedlalr/run_sweeps.sh tune synthetic      # stage 1: learning-rate grids, seed 0
#   bash experiments/fedlalr/run_sweeps.sh final synthetic     # stage 2: picked settings, seeds 1-3
# Sweep directories go to ${SWEEPS:-/tmp/fedlalr_sweeps}/<stage>_<file name>; rerunning continues them.
set -u
stage=$1 scenario=$2
out=${SWEEPS:-/tmp/fedlalr_sweeps}
for file in experiments/fedlalr/sweeps/$stage/${scenario}_*.yaml; do
    name=$(basename "$file" .yaml)
    start=$(date +%s)
    rayfed sweep "$file" $([ $stage = tune ] && echo --select best_test_accuracy) --out "$out/${stage}_$name" --quiet
    echo "== $name: $(( $(date +%s) - start )) s wall"
done
