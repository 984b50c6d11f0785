#!/usr/bin/env bash
# Installs the Debian packages the tests and the offline rehearsal need (sshd, ip, shellcheck,
# and promtool from the prometheus package: tests/test_alerts.py checks monitoring's rules).
set -euo pipefail

readonly PACKAGES=(openssh-server openssh-client iproute2 shellcheck procps prometheus)

err() { echo "ensure_system_deps: $*" >&2; }

missing_packages() {
  local pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q "install ok installed" \
      || echo "${pkg}"
  done
}

main() {
  local missing
  missing="$(missing_packages)"
  if [[ -z "${missing}" ]]; then
    return 0
  fi
  if [[ "$(id -u)" != 0 ]]; then
    err "missing packages: ${missing//$'\n'/ }; run as root or: sudo apt-get install ${missing//$'\n'/ }"
    return 1
  fi
  echo "installing: ${missing//$'\n'/ }"
  apt-get update -qq
  # shellcheck disable=SC2086  # word splitting of the package list is intended
  # no recommends: the prometheus package would pull in node_exporter; only promtool is used
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${missing} \
    >/dev/null
}

main "$@"
