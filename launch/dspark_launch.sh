#!/usr/bin/env bash
# One safe command for one pair of DGX Sparks: DeepSeek-V4-Flash + DSpark, TP=2, no Ray.
# Bash only sequences the steps; every decision lives in pairctl/ (python -m pairctl, unit-tested).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
readonly REPO_ROOT
readonly EXIT_USAGE=2
readonly EXIT_PREFLIGHT=3
readonly EXIT_BOOT=4
readonly EXIT_TIMEOUT=5
readonly EXIT_GATE=6
readonly DEFAULT_TIMEOUT_S=900

CMD="up"
ENV_FILE="${REPO_ROOT}/.env"
RECIPE="${REPO_ROOT}/recipes/dsv4-flash-dspark.yaml"
OVERLAY_SRC="${REPO_ROOT}/mods/dsv4-flash-overlays"
JSON_OUT=""
TIMEOUT_S="${DEFAULT_TIMEOUT_S}"
GATE=0
RANK=0
FOLLOW=0
TAIL=""
PYTHON=""
BOOTING=0
LOCK_FD=""
VLLM_EXTRA=()

#######################################
# Print an error to stderr.
# Arguments: message words.
#######################################
err() {
  echo "dspark_launch: $*" >&2
}

#######################################
# Print usage.
# Outputs: help text on stdout.
#######################################
usage() {
  cat <<USAGE
Usage: launch/dspark_launch.sh [up|down|status|logs|plan|preflight|sync-overlays] [options]
                               [-- VLLM_ARGS...]
       launch/dspark_launch.sh fleet plan|up|down|status|prometheus [options]   (--help there)

Run on the rank-0 Spark (SPARK1). One OpenAI endpoint at http://SPARK1:PORT/v1.

Commands:
  up          (default) preflight; remove this pair's stale containers on both nodes; start
              rank 1 over ssh (--node-rank 1 --headless), then rank 0; wait for /health and
              /v1/models showing elapsed time and boot phase; if a rank dies, tear both down
              and print its log tail. On an already healthy pair: says so, changes nothing.
  down        stop and remove this pair's containers (label dsv4.pair=PAIR_ID) on both nodes.
  status      per-node container state, endpoint health, model, running/waiting requests.
  logs        container log of one rank (--rank 0|1, -f to follow, --tail N).
  plan        print the exact docker run lines per rank (env, mounts, vLLM args; secrets
              masked). Changes nothing.
  preflight   read-only checks with stable IDs (PASS/WARN/FAIL + remedy); --json FILE writes
              the evidence. up runs it first and stops on any FAIL.
  sync-overlays
              copy the files that ship in mods/dsv4-flash-overlays/ to OVERLAY_DIR on both
              nodes, check every file's sha256 on arrival, then swap the copy in (a node that
              fails keeps its old copy; exit 1).

Options:
  --env-file FILE   pair config (default: ${REPO_ROOT}/.env; see .env.example)
  --recipe FILE     serving recipe (default: recipes/dsv4-flash-dspark.yaml)
  --json FILE       preflight/up: write the preflight evidence as JSON
  --timeout S       up: seconds to wait for health (default ${DEFAULT_TIMEOUT_S}; first boot ~10 min)
  --gate            up: run bench/quality_ref_dspark.py against the endpoint when healthy
  --src DIR         sync-overlays: overlay package to copy (default mods/dsv4-flash-overlays)
  --rank 0|1        logs: which rank (default 0)
  -f, --follow      logs: follow
  --tail N          logs: last N lines
  -h, --help        this help
  -- ARGS           extra vllm serve args for both ranks (override the recipe)

Exit codes: 0 ok (also: up on a healthy pair), 1 other runtime error (e.g. down could not
reach a node), 2 usage/config error, 3 preflight FAIL (nothing started or removed),
4 boot failure (both ranks torn down), 5 health timeout (both torn down), 6 quality gate
failed (endpoint left running).
USAGE
}

#######################################
# Pick the Python that has the project deps.
# Globals: PYTHON (set), PAIRCTL_PYTHON (read).
#######################################
pick_python() {
  if [[ -n "${PAIRCTL_PYTHON:-}" ]]; then
    PYTHON="${PAIRCTL_PYTHON}"
  elif [[ -x "${REPO_ROOT}/.venv/bin/python" ]]; then
    PYTHON="${REPO_ROOT}/.venv/bin/python"
  else
    PYTHON="python3"
  fi
  if ! "${PYTHON}" -c 'import pairctl' 2>/dev/null; then
    err "${PYTHON} cannot import pairctl; install the project first: make -C ${REPO_ROOT} venv WITH_VLLM=0"
    exit "${EXIT_USAGE}"
  fi
}

#######################################
# Run a pairctl step with this run's env file, recipe and extra vLLM args.
# Arguments: subcommand, then its own options.
# Returns: the step's exit code.
#######################################
pairctl() {
  local sub="$1"
  shift
  local -a argv=("${PYTHON}" -m pairctl "${sub}" --env-file "${ENV_FILE}" --recipe "${RECIPE}" "$@")
  if ((${#VLLM_EXTRA[@]} > 0)); then
    argv+=(-- "${VLLM_EXTRA[@]}")
  fi
  "${argv[@]}"
}

#######################################
# Parse the command line into globals.
# Arguments: "$@" of the script.
#######################################
parse_args() {
  local seen_cmd=0
  while (($# > 0)); do
    case "$1" in
      up | down | status | logs | plan | preflight | sync-overlays)
        if ((seen_cmd)); then
          err "two commands given ('${CMD}' and '$1'); pick one (see --help)"
          exit "${EXIT_USAGE}"
        fi
        CMD="$1"
        seen_cmd=1
        ;;
      -h | --help)
        usage
        exit 0
        ;;
      --env-file | --recipe | --json | --timeout | --rank | --tail | --src)
        if (($# < 2)); then
          err "$1 needs a value (see --help)"
          exit "${EXIT_USAGE}"
        fi
        case "$1" in
          --env-file) ENV_FILE="$2" ;;
          --recipe) RECIPE="$2" ;;
          --json) JSON_OUT="$2" ;;
          --timeout) TIMEOUT_S="$2" ;;
          --rank) RANK="$2" ;;
          --tail) TAIL="$2" ;;
          --src) OVERLAY_SRC="$2" ;;
        esac
        shift
        ;;
      --env-file=* | --recipe=* | --json=* | --timeout=* | --rank=* | --tail=* | --src=*)
        set -- "${1%%=*}" "${1#*=}" "${@:2}"
        continue
        ;;
      --gate) GATE=1 ;;
      -f | --follow) FOLLOW=1 ;;
      --)
        shift
        VLLM_EXTRA=("$@")
        break
        ;;
      *)
        err "unknown argument '$1' (see --help)"
        exit "${EXIT_USAGE}"
        ;;
    esac
    shift
  done
  if [[ ! "${TIMEOUT_S}" =~ ^[0-9]+$ ]] || ((TIMEOUT_S < 1)); then
    err "--timeout must be a whole number of seconds, got '${TIMEOUT_S}'"
    exit "${EXIT_USAGE}"
  fi
  if [[ "${RANK}" != "0" && "${RANK}" != "1" ]]; then
    err "--rank must be 0 or 1, got '${RANK}'"
    exit "${EXIT_USAGE}"
  fi
  if [[ -n "${TAIL}" && ! "${TAIL}" =~ ^[0-9]+$ ]]; then
    err "--tail must be a number, got '${TAIL}'"
    exit "${EXIT_USAGE}"
  fi
}

#######################################
# Serialise up/down per pair: two operators must not race on one pair.
# Globals: LOCK_FD (set). Exits 3 when another run holds the lock.
#######################################
acquire_lock() {
  if ! command -v flock >/dev/null 2>&1; then
    err "WARN: flock not found; not serialising concurrent runs for this pair"
    return 0
  fi
  local path
  path="$(pairctl lock-path)"
  exec {LOCK_FD}>>"${path}"
  if ! flock -n "${LOCK_FD}"; then
    err "another up/down for this pair is running (lock ${path}); nothing was started or removed"
    exit "${EXIT_PREFLIGHT}"
  fi
}

#######################################
# Remove this pair's containers on both nodes (label-selected, idempotent).
#######################################
teardown() {
  err "tearing down pair containers on both nodes"
  pairctl cleanup || err "teardown incomplete: run 'launch/dspark_launch.sh down' once the node answers"
}

#######################################
# Trap handler: a boot that did not finish is torn down, on error or on Ctrl-C.
# Globals: BOOTING.
#######################################
on_signal() {
  trap - INT TERM HUP
  if ((BOOTING)); then
    BOOTING=0
    err "interrupted during boot"
    teardown
  fi
  exit 130
}

#######################################
# up: preflight, clean, start worker then head, wait, optional gate.
#######################################
cmd_up() {
  local rc=0
  pairctl validate || exit "$?"
  acquire_lock
  if pairctl healthy; then
    if ((GATE)); then
      run_gate
    fi
    return 0
  fi
  local -a pf_args=()
  if [[ -n "${JSON_OUT}" ]]; then
    pf_args+=(--json "${JSON_OUT}")
  fi
  pairctl preflight "${pf_args[@]}" || rc=$?
  if ((rc != 0)); then
    if ((rc != EXIT_PREFLIGHT && rc != EXIT_USAGE)); then
      err "preflight could not run (rc=${rc}); nothing was started or removed"
      rc="${EXIT_PREFLIGHT}"
    fi
    exit "${rc}"
  fi

  BOOTING=1
  trap on_signal INT TERM HUP
  if ! pairctl cleanup; then
    err "could not remove this pair's stale containers; nothing new was started"
    BOOTING=0
    exit "${EXIT_BOOT}"
  fi
  local rank
  for rank in 1 0; do
    if ! pairctl start --rank "${rank}"; then
      err "rank ${rank} did not start"
      teardown
      BOOTING=0
      exit "${EXIT_BOOT}"
    fi
  done
  rc=0
  pairctl wait --timeout "${TIMEOUT_S}" || rc=$?
  if ((rc != 0)); then
    teardown
    BOOTING=0
    if ((rc == EXIT_TIMEOUT)); then
      exit "${EXIT_TIMEOUT}"
    fi
    exit "${EXIT_BOOT}"
  fi
  BOOTING=0
  trap - INT TERM HUP
  if ((GATE)); then
    run_gate
  fi
}

#######################################
# Post-up quality gate (5 greedy prompts, exact answers). Endpoint stays up either way.
#######################################
run_gate() {
  local url
  url="$(pairctl endpoint)"
  local -a gate=("${PYTHON}" -m bench.quality_ref_dspark --url "${url}")
  if ! "${gate[@]}"; then
    err "quality gate FAILED against ${url} (endpoint left running for inspection)"
    exit "${EXIT_GATE}"
  fi
  echo "quality gate passed"
}

#######################################
# down: remove this pair's containers on both nodes, nothing else.
#######################################
cmd_down() {
  pairctl validate || exit "$?"
  acquire_lock
  if ! pairctl cleanup; then
    err "down incomplete (a node did not answer); re-run once it does"
    exit 1
  fi
  echo "pair down: no containers of this pair remain"
}

#######################################
# logs: one rank's container log.
#######################################
cmd_logs() {
  local -a args=(--rank "${RANK}")
  if ((FOLLOW)); then
    args+=(-f)
  fi
  if [[ -n "${TAIL}" ]]; then
    args+=(--tail "${TAIL}")
  fi
  pairctl logs "${args[@]}"
}

main() {
  if [[ "${1:-}" == "fleet" ]]; then
    shift
    pick_python
    exec "${PYTHON}" -m pairctl.fleet "$@"
  fi
  parse_args "$@"
  pick_python
  case "${CMD}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) pairctl status ;;
    logs) cmd_logs ;;
    plan) pairctl plan ;;
    sync-overlays) pairctl sync-overlays --src "${OVERLAY_SRC}" ;;
    preflight)
      if [[ -n "${JSON_OUT}" ]]; then
        pairctl preflight --json "${JSON_OUT}"
      else
        pairctl preflight
      fi
      ;;
  esac
}

main "$@"
