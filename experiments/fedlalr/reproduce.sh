#!/usr/bin/env bash
# The measured comparison of README.md, end to end, for one scenario (synthetic or digits), from
# the repository root; about 10 minutes of wall time per scenario on 2 cores:
#   bash experiments/fedlalr/reproduce.sh synthetic
# Sweep directories go to ${SWEEPS:-/tmp/fedlalr_sweeps}; reports into experiments/fedlalr/results/SCENARIO.
set -eu
scenario=$1
export SWEEPS=${SWEEPS:-/tmp/fedlalr_sweeps}
case $scenario in
    synthetic) targets=(0.8 0.84) ;;
    digits) targets=(0.9 0.95) ;;
    *) echo "scenario: synthetic or digits" >&2; exit 2 ;;
esac
here=experiments/fedlalr
results=$here/results/$scenario
bash $here/run_sweeps.sh tune "$scenario"                               # stage 1: grids on seed 0
python $here/make_final_sweeps.py "$scenario" "$SWEEPS"                  # writes sweeps/final/SCENARIO_*.yaml
bash $here/run_sweeps.sh final "$scenario"                              # stage 2: picked lrs, seeds 1-3
mkdir -p "$results"
rayfed report "$SWEEPS"/final_"$scenario"_* --target "${targets[1]}" --out "$results"
stability_args=(--target "${targets[0]}" --target "${targets[1]}")
python $here/stability.py "${stability_args[@]}" "$SWEEPS"/final_"$scenario"_* > /tmp/stability_"$scenario".md
python $here/stability.py "${stability_args[@]}" --group algorithm.name,algorithm.lr_local,algorithm.lr_global \
    "$SWEEPS"/tune_"$scenario"_* > /tmp/tuning_stability_"$scenario".md
rayfed report "$SWEEPS"/tune_"$scenario"_* --group algorithm.name algorithm.lr_local algorithm.lr_global \
    --target "${targets[0]}" --out /tmp/tuning_grid_"$scenario"
for selection in "$SWEEPS"/tune_"$scenario"_*/selection.md; do echo "$selection"; cat "$selection"; done
echo "stability tables: /tmp/stability_$scenario.md, /tmp/tuning_stability_$scenario.md; grid: /tmp/tuning_grid_$scenario/report.md"
