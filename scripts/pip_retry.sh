#!/usr/bin/env bash
# Runs one pip install command up to PIP_ATTEMPTS times (default 3), waiting between tries.
# Why: a CI run failed when PyPI's connection dropped mid-download of torch; pip resumes a
# dropped download within one run (PIP_RESUME_RETRIES), and a new run takes the wheels it
# already finished from its cache, so a retry costs only what was lost.
set -euo pipefail

usage() {
  cat <<USAGE
usage: scripts/pip_retry.sh COMMAND [ARG...]

Runs COMMAND (a pip install) up to PIP_ATTEMPTS times (default 3), ${PIP_RETRY_WAIT_S:-15} s
apart, and exits with its last exit status.
USAGE
}

main() {
  if [[ $# -eq 0 || "${1}" == "-h" || "${1}" == "--help" ]]; then
    usage
    [[ $# -gt 0 ]]
    return
  fi
  local attempts="${PIP_ATTEMPTS:-3}" wait_s="${PIP_RETRY_WAIT_S:-15}" try=1 rc=0
  while true; do
    "$@" && return 0 || rc=$?
    if (( try >= attempts )); then
      echo "pip_retry: gave up after ${try} tries (exit ${rc}): $*" >&2
      return "${rc}"
    fi
    echo "pip_retry: try ${try}/${attempts} failed (exit ${rc}); again in ${wait_s} s" >&2
    sleep "${wait_s}"
    try=$((try + 1))
  done
}

main "$@"
