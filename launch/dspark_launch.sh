#!/usr/bin/env bash
# One safe command for one pair of DGX Sparks: DeepSeek-V4-Flash + DSpark, TP=2, no Ray.
# The operator's front door (the seed's name), a shim over the `dspark` console script: it
# finds the Python that has the project installed and runs dspark's main under this name
# with the same arguments. Every command (up, down, status, logs, plan, preflight,
# sync-overlays, watch, fleet, and dspark's bench/sim/gate/...) runs in that one process,
# which parses the options, prints --help and owns the exit codes (docs/INTERFACES.md).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
readonly REPO_ROOT
readonly EXIT_USAGE=2
ENTRY="import sys
try:
    from pairctl.cli.dspark import main
except ModuleNotFoundError as exc:
    if exc.name != 'pairctl':
        raise
    sys.exit(print(f'dspark_launch: {sys.executable} cannot import pairctl; install the '
                   'project first: make -C ${REPO_ROOT} venv', file=sys.stderr) or ${EXIT_USAGE})
sys.exit(main(sys.argv[1:], prog='launch/dspark_launch.sh'))"
readonly ENTRY

#######################################
# Print an error to stderr.
# Arguments: message words.
#######################################
err() {
  echo "dspark_launch: $*" >&2
}

#######################################
# The Python that has the project installed: PAIRCTL_PYTHON, else the repo's .venv, else
# python3 on PATH.
# Globals: PAIRCTL_PYTHON (read), REPO_ROOT.
# Outputs: the interpreter's path on stdout.
#######################################
pick_python() {
  if [[ -n "${PAIRCTL_PYTHON:-}" ]]; then
    echo "${PAIRCTL_PYTHON}"
  elif [[ -x "${REPO_ROOT}/.venv/bin/python" ]]; then
    echo "${REPO_ROOT}/.venv/bin/python"
  else
    echo "python3"
  fi
}

main() {
  local python
  python="$(pick_python)"
  if ! command -v "${python}" >/dev/null 2>&1; then
    err "no Python at ${python}; install the project first: make -C ${REPO_ROOT} venv"
    exit "${EXIT_USAGE}"
  fi
  # dspark's main, with a message naming the fix when pairctl is not installed there
  # (one process either way; relative paths in the arguments stay relative to the cwd).
  exec "${python}" -c "${ENTRY}" "$@"
}

main "$@"
