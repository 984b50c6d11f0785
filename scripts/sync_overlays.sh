#!/usr/bin/env bash
# Copy mods/dsv4-flash-overlays/ to OVERLAY_DIR on both nodes of a pair over ssh, verify
# every file's sha256 on arrival, then swap it in (Quickstart step 2 as one command).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
readonly REPO_ROOT

#######################################
# Print an error to stderr.
#######################################
err() {
  echo "sync_overlays: $*" >&2
}

usage() {
  cat <<USAGE
Usage: scripts/sync_overlays.sh [--env-file FILE] [--src DIR]

Copies the overlay package (default: ${REPO_ROOT}/mods/dsv4-flash-overlays, without
__pycache__/*.pyc/*.egg-info/build) to OVERLAY_DIR on SPARK1 (local) and SPARK2 (ssh, host-key
checking on), checks sha256 of every file on arrival, and only then replaces the old copy.
Exit: 0 both nodes verified, 1 a node failed (its old copy is kept), 2 usage/config error.
USAGE
}

main() {
  local env_file="${REPO_ROOT}/.env"
  local src="${REPO_ROOT}/mods/dsv4-flash-overlays"
  while (($# > 0)); do
    case "$1" in
      -h | --help)
        usage
        return 0
        ;;
      --env-file | --src)
        if (($# < 2)); then
          err "$1 needs a value"
          exit 2
        fi
        if [[ "$1" == "--env-file" ]]; then env_file="$2"; else src="$2"; fi
        shift
        ;;
      *)
        err "unknown argument '$1' (see --help)"
        exit 2
        ;;
    esac
    shift
  done
  local python="${PAIRCTL_PYTHON:-}"
  if [[ -z "${python}" ]]; then
    if [[ -x "${REPO_ROOT}/.venv/bin/python" ]]; then
      python="${REPO_ROOT}/.venv/bin/python"
    else
      python="python3"
    fi
  fi
  local -a argv=("${python}" "${REPO_ROOT}/scripts/pairctl_cli.py" sync-overlays
    --env-file "${env_file}" --src "${src}")
  "${argv[@]}"
}

main "$@"
