#!/usr/bin/env bash
# Submit one rayfed run to a running Ray cluster as a Ray job.
#
# The repository is shipped to every node with --working-dir (minus runs/, data/, .git and
# build leftovers), so the cluster only needs Python with torch & co. installed, or --pip.
# The job's driver, and so the run directory, lives on the cluster's head node: pass
# --out /an/absolute/path to know where to fetch it from.
set -euo pipefail

usage() {
    cat >&2 <<'USAGE'
usage: clusters/submit.sh [--address URL] [--pip] CONFIG [key=value ...] [--out DIR] [--quiet]

  --address URL  the cluster's dashboard (job) address
                 (default: $RAY_ADDRESS, else http://127.0.0.1:8265)
  --pip          also pip-install rayfed's dependencies (clusters/requirements.txt)
                 into the job's runtime env (for nodes whose image has Ray but not torch)
  CONFIG         a rayfed YAML file inside this repository
  key=value ...  rayfed overrides, e.g. engine.num_workers=8 engine.worker_gpus=0.25
  --out DIR      the run directory ON THE HEAD NODE (use an absolute path)

Token auth: RAY_AUTH_MODE=token is exported unless already set; the token comes from
RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token.
USAGE
}

die() {
    echo "submit.sh: error: $*" >&2
    exit 2
}

address="${RAY_ADDRESS:-http://127.0.0.1:8265}"
pip=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --address) [[ $# -ge 2 ]] || die "--address needs a URL"; address="$2"; shift 2 ;;
        --address=*) address="${1#--address=}"; shift ;;
        --pip) pip=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done

if [[ $# -eq 0 ]]; then
    usage
    exit 2
fi
config="$1"
shift
[[ -f "$config" ]] || die "CONFIG '$config' is not a file"

# rayfed runs from the shipped copy of the repo, so the config must be inside the repo and is
# passed relative to its root.
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
config_abs="$(cd "$(dirname "$config")" && pwd -P)/$(basename "$config")"
case "$config_abs" in
    "$repo_root"/*) config_rel="${config_abs#"$repo_root"/}" ;;
    *) die "CONFIG '$config' is outside the repository $repo_root (only the repository is shipped)" ;;
esac

command -v ray >/dev/null 2>&1 || die "'ray' is not on PATH (pip install 'ray[default]')"

export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

# Anchored patterns: a bare "data" would also drop the rayfed/data package.
excludes='"/runs", "/data", ".git", "*.egg-info", "__pycache__", ".pytest_cache"'
if [[ $pip -eq 1 ]]; then
    # Ray reads a requirements file given by its path on this machine, and ships its lines.
    runtime_env='{"excludes": ['"$excludes"'], "pip": "'"$repo_root"'/clusters/requirements.txt"}'
else
    runtime_env='{"excludes": ['"$excludes"']}'
fi

# `python -m rayfed` rather than the `rayfed` script: the package comes with the working dir,
# and the console script exists only where rayfed is pip-installed.
exec ray job submit \
    --address "$address" \
    --working-dir "$repo_root" \
    --runtime-env-json "$runtime_env" \
    -- python -m rayfed run "$config_rel" "$@"
