#!/usr/bin/env bash
# Runs the claims' sweeps (sweeps/claims/${SCENARIO:-synthetic}_NAME.yaml) one after another, from the
# repository root:
#   bash experiments/fedlalr/run_claims.sh tune3 vhat interval final3 scaling_s50 scaling
#   CLAIMS=/tmp/fedlalr_claims_digits SCENARIO=digits bash experiments/fedlalr/run_claims.sh tune3 final3
# They run vectorised (engine.vectorize=true): a sweep's trials that differ only in seed and rates pack into one
# batched computation, equal to the runs alone within tolerance, not in bits (stage 2, sweeps/final/, ran
# unvectorised). Sweep directories go to ${CLAIMS:-/tmp/fedlalr_claims}/NAME; rerunning continues them.
set -u
out=${CLAIMS:-/tmp/fedlalr_claims}
scenario=${SCENARIO:-synthetic}
for name in "$@"; do
    start=$(date +%s)
    rayfed sweep experiments/fedlalr/sweeps/claims/${scenario}_$name.yaml \
        engine.vectorize=true --out "$out/$name" --quiet
    echo "== $name: $(( $(date +%s) - start )) s wall"
done
