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
readonly COMMANDS="up down status logs plan preflight sync-overlays watch"
# Which command each option applies to; any other combination is a usage error (exit 2),
# never silently ignored. "--" = the extra vLLM args.
declare -rA APPLIES=(
  [--json]="up preflight status"
  [--timeout]="up watch"
  [--gate]="up"
  [--src]="sync-overlays"
  [--rank]="logs"
  [--follow]="logs"
  [--tail]="logs"
  [--watch]="status"
  [--interval]="status watch"
  [--failures]="watch"
  [--probe-timeout]="watch"
  [--backoff]="watch"
  [--]="up plan preflight status watch"
)

CMD="up"
ENV_FILE="${REPO_ROOT}/.env"
RECIPE="${REPO_ROOT}/recipes/dsv4-flash-dspark.yaml"
OVERLAY_SRC="${REPO_ROOT}/mods/dsv4-flash-overlays"
JSON_OUT=""
JSON_FLAG=0
TIMEOUT_S="${DEFAULT_TIMEOUT_S}"
GATE=0
WATCH=0
RANK=0
FOLLOW=0
TAIL=""
PYTHON=""
BOOTING=0
LOCK_FD=""
VLLM_EXTRA=()
PASS_OPTS=() # status/watch options pairctl validates itself (numbers, ranges)
declare -A GIVEN=()

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
Usage: launch/dspark_launch.sh [up|down|status|logs|plan|preflight|sync-overlays|watch]
                               [options] [-- VLLM_ARGS...]
       launch/dspark_launch.sh fleet plan|up|down|status|prometheus [options]   (--help there)

Run on the rank-0 Spark (SPARK1). One OpenAI endpoint at http://SPARK1:PORT/v1.

Commands:
  up          (default) preflight; remove this pair's stale containers on both nodes; start
              rank 1 over ssh (--node-rank 1 --headless), then rank 0; wait for /health and
              /v1/models showing elapsed time and boot phase; if a rank dies, tear both down
              and print its log tail. On an already healthy pair: says so, changes nothing.
  down        stop and remove this pair's containers (label dsv4.pair=PAIR_ID) on both nodes.
  status      each rank's container state and uptime, endpoint health and model, and live
              serving figures from /metrics: running/waiting, decode tok/s, TTFT p50/p95,
              KV-cache use, prefix-cache hit rate, DSpark acceptance per draft position and
              mean acceptance length. --json for machines, --watch for a live view.
              Exit 0 healthy, 7 degraded, 8 down.
  logs        container log of one rank (--rank 0|1, -f to follow, --tail N).
  plan        print the exact docker run lines per rank (env, mounts, vLLM args; secrets
              masked). Changes nothing.
  preflight   read-only checks with stable IDs (PASS/WARN/FAIL + remedy); --json FILE writes
              the evidence. up runs it first and stops on any FAIL.
  sync-overlays
              copy the files that ship in mods/dsv4-flash-overlays/ to OVERLAY_DIR on both
              nodes, check every file's sha256 on arrival, then swap the copy in (a node that
              fails keeps its old copy; exit 1). Refuses (exit 3) unless this machine is
              SPARK1 and SPARK2 is another one (PF-SELF-IS-SPARK1, PF-DISTINCT-NODES).
  watch       watchdog: a 1-token completion every --interval s; after --failures failed
              probes in a row, down then up (backoff after a failed up). Runs until stopped
              (SIGTERM/Ctrl-C); one timestamped line per event. launch/dsv4-watch@.service
              runs it under systemd.

Options:
  --env-file FILE   pair config (default: ${REPO_ROOT}/.env; see .env.example)
  --recipe FILE     serving recipe (default: recipes/dsv4-flash-dspark.yaml)
  --json FILE       preflight/up: write the preflight evidence as JSON
  --json            status: print one JSON document instead (with --watch: one per line)
  --timeout S       up, watch: seconds to wait for health (default ${DEFAULT_TIMEOUT_S}; first boot
                    ~10 min), a whole number >= 1
  --gate            up: run bench/quality_ref_dspark.py against the endpoint when healthy
  --src DIR         sync-overlays: overlay package to copy (default mods/dsv4-flash-overlays)
  --rank 0|1        logs: which rank (default 0)
  -f, --follow      logs: follow
  --tail N          logs: last N lines
  --watch           status: live view, redrawn every --interval seconds until Ctrl-C
  --interval S      status: seconds the rates are measured over (default 1; --watch: refresh,
                    default 2); watch: seconds between probes (default 30)
  --failures K      watch: failed probes in a row before a restart (default 3)
  --probe-timeout S watch: seconds one probe may take (default 60)
  --backoff S       watch: wait after a failed restart, doubling up to 600 s (default 30)
  -h, --help        this help
  -- ARGS           extra vllm serve args for both ranks (override the recipe)

Exit codes: 0 ok (also: up on a healthy pair; status: healthy), 1 other runtime error (e.g.
down or logs could not reach a node, logs found no container), 2 usage/config error,
3 preflight FAIL (nothing started or removed; also sync-overlays run off SPARK1), 4 boot
failure (both ranks torn down), 5 health timeout (both torn down), 6 quality gate failed
(endpoint left running), 7 status: degraded (something runs, not all of it healthy),
8 status: down (no endpoint, no rank running).
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
  local seen_cmd=0 opt
  while (($# > 0)); do
    case "$1" in
      up | down | status | logs | plan | preflight | sync-overlays | watch)
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
      --json)
        GIVEN[--json]="$1"
        # status --json is a flag; up/preflight --json take a FILE.
        if (($# >= 2)) && [[ "$2" != -* ]] && [[ " ${COMMANDS} " != *" $2 "* ]]; then
          JSON_OUT="$2"
          shift
        else
          JSON_FLAG=1
        fi
        ;;
      --env-file | --recipe | --timeout | --rank | --tail | --src | --interval | --failures | \
        --probe-timeout | --backoff)
        if (($# < 2)); then
          err "$1 needs a value (see --help)"
          exit "${EXIT_USAGE}"
        fi
        if [[ -v APPLIES[$1] ]]; then
          GIVEN[$1]="$1"
        fi
        case "$1" in
          --env-file) ENV_FILE="$2" ;;
          --recipe) RECIPE="$2" ;;
          --timeout) TIMEOUT_S="$2" ;;
          --rank) RANK="$2" ;;
          --tail) TAIL="$2" ;;
          --src) OVERLAY_SRC="$2" ;;
          *) PASS_OPTS+=("$1" "$2") ;;
        esac
        shift
        ;;
      --env-file=* | --recipe=* | --json=* | --timeout=* | --rank=* | --tail=* | --src=* | \
        --interval=* | --failures=* | --probe-timeout=* | --backoff=*)
        if [[ "$1" == --json=* ]]; then
          GIVEN[--json]="--json"
          JSON_OUT="${1#*=}"
          shift
          continue
        fi
        set -- "${1%%=*}" "${1#*=}" "${@:2}"
        continue
        ;;
      --gate)
        GIVEN[--gate]="$1"
        GATE=1
        ;;
      --watch)
        GIVEN[--watch]="$1"
        WATCH=1
        ;;
      -f | --follow)
        GIVEN[--follow]="$1"
        FOLLOW=1
        ;;
      --)
        shift
        GIVEN[--]="extra vLLM args after --"
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
  for opt in "${!GIVEN[@]}"; do
    if [[ " ${APPLIES[${opt}]} " != *" ${CMD} "* ]]; then
      err "${GIVEN[${opt}]} does not apply to ${CMD} (only to: ${APPLIES[${opt}]// /, }); see --help"
      exit "${EXIT_USAGE}"
    fi
  done
  if [[ "${CMD}" == "status" && -n "${JSON_OUT}" ]]; then
    err "status --json prints JSON on stdout and takes no FILE (got '${JSON_OUT}'); redirect it: status --json > FILE"
    exit "${EXIT_USAGE}"
  fi
  if [[ "${CMD}" != "status" ]] && ((JSON_FLAG)); then
    err "--json needs a FILE for ${CMD} (see --help)"
    exit "${EXIT_USAGE}"
  fi
  if [[ ! "${TIMEOUT_S}" =~ ^[0-9]+$ ]]; then
    err "--timeout must be a whole number of seconds (at least 1), got '${TIMEOUT_S}'"
    exit "${EXIT_USAGE}"
  fi
  if ((10#${TIMEOUT_S} < 1)); then
    err "--timeout must be at least 1 second, got '${TIMEOUT_S}'"
    exit "${EXIT_USAGE}"
  fi
  if [[ "${RANK}" != "0" && "${RANK}" != "1" ]]; then
    err "--rank must be 0 or 1, got '${RANK}'"
    exit "${EXIT_USAGE}"
  fi
  if [[ -n "${TAIL}" && ! "${TAIL}" =~ ^[0-9]+$ ]]; then
    err "--tail must be a whole number of lines (0 or more), got '${TAIL}'"
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
  local -a pf_args=()
  if [[ -n "${JSON_OUT}" ]]; then
    pf_args+=(--json "${JSON_OUT}")
  fi
  pairctl validate "${pf_args[@]}" || exit "$?"
  acquire_lock
  if pairctl healthy; then
    if ((GATE)); then
      run_gate
    fi
    return 0
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
  # pairctl gate runs bench.quality_ref_dspark with the pair's VLLM_API_KEY (by env).
  if ! pairctl gate; then
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

#######################################
# status: the operator's view (exit 0 healthy, 7 degraded, 8 down).
#######################################
cmd_status() {
  local -a args=()
  if ((JSON_FLAG)); then
    args+=(--json)
  fi
  if ((WATCH)); then
    args+=(--watch)
  fi
  pairctl status "${args[@]}" "${PASS_OPTS[@]}"
}

#######################################
# watch: the watchdog. exec, so SIGTERM (systemd stop) reaches it directly.
#######################################
cmd_watch() {
  local -a argv=("${PYTHON}" -m pairctl watch --env-file "${ENV_FILE}" --recipe "${RECIPE}"
    --launcher "${SCRIPT_DIR}/dspark_launch.sh" --timeout "${TIMEOUT_S}" "${PASS_OPTS[@]}")
  if ((${#VLLM_EXTRA[@]} > 0)); then
    argv+=(-- "${VLLM_EXTRA[@]}")
  fi
  exec "${argv[@]}"
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
    status) cmd_status ;;
    logs) cmd_logs ;;
    plan) pairctl plan ;;
    watch) cmd_watch ;;
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
