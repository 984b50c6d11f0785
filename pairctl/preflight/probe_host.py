"""Host facts the peers learned the hard way: the probe's shell fragment and its parsers.

Sections (appended to pairctl.preflight.probe's script; all read-only except ``mkdir -p`` of the
cache directories, which preflight creates like the TileLang cache):

- ``kernel``/``gpu``/``meminfo``: ``uname -r``, the GPU's name (nvidia-smi; GB10 shares
  system memory) and the /proc/meminfo lines vLLM's memory check and the kernel's CMA bug
  depend on (MemTotal, MemAvailable, MemFree, CmaTotal, CmaFree), and swap (SwapTotal,
  SwapFree) for the memory-pressure bands.
- ``rdma``: the uverbs character devices in RDMA_DEVICE_DIR (what libibverbs opens).
- ``links``: every netdev's MTU and operstate; ``ibports``: each RDMA port's state and
  the netdev behind it (RoCE runs over that netdev's MTU).
- ``caches``: whether each JIT cache directory exists (created if missing) and is writable.
- ``model_rev``: the model's Hugging Face commit, from an HF cache snapshot path
  (``.../snapshots/<commit>``) or the download metadata huggingface_hub writes into a
  ``--local-dir`` download (``.cache/huggingface/download/config.json.metadata``, first line).
- ``earlyoom``: whether an earlyoom process runs (it kills vLLM under load).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The memory facts, shared with `status`/`watch` (pairctl/status/memory.py): one reader of
# /proc/meminfo and one earlyoom test for preflight and the running pair alike.
MEMINFO_SECTION = r"""
sec meminfo
grep -E '^(MemTotal|MemAvailable|MemFree|CmaTotal|CmaFree|SwapTotal|SwapFree):' \
  /proc/meminfo 2>/dev/null
"""
EARLYOOM_SECTION = r"""
sec earlyoom
cat /proc/[0-9]*/comm 2>/dev/null | grep -x earlyoom | head -n 1
"""

# Appended to the probe script; $RDMA, $CACHES ("NAME=DIR" words) and $MODEL are bound.
PROBE_SECTION = (
    r"""
sec kernel; uname -r
sec gpu; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1
"""
    + MEMINFO_SECTION
    + r"""
sec rdma
if [ -d "$RDMA" ]; then
  echo "dir=yes"
  for f in "$RDMA"/uverbs*; do [ -c "$f" ] && echo "${f##*/}"; done
else echo "dir=no"; fi
sec links
for n in /sys/class/net/*; do
  [ -e "$n/mtu" ] || continue
  printf '%s %s %s\n' "${n##*/}" "$(cat "$n/mtu" 2>/dev/null)" \
    "$(cat "$n/operstate" 2>/dev/null)"
done
sec ibports
for p in /sys/class/infiniband/*/ports/*; do
  [ -r "$p/state" ] || continue
  d=${p%/ports/*}; d=${d##*/}
  nd=$(ls "/sys/class/infiniband/$d/device/net" 2>/dev/null | head -n 1)
  printf '%s %s %s %s\n' "$d" "${p##*/}" "${nd:--}" "$(cut -d' ' -f2 < "$p/state")"
done
sec caches
for c in $CACHES; do
  d=${c#*=}
  if mkdir -p "$d" 2>/dev/null && [ -w "$d" ]; then echo "${c%%=*} ok"
  else echo "${c%%=*} fail"; fi
done
sec model_rev
echo "path=$(readlink -f "$MODEL" 2>/dev/null)"
m="$MODEL/.cache/huggingface/download/config.json.metadata"
[ -r "$m" ] && echo "meta=$(head -n 1 "$m")"
"""
    + EARLYOOM_SECTION
)

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(?:/|$)")


@dataclass(frozen=True)
class Link:
    """One netdev: its MTU and operstate (``up``, ``down``, ``unknown``...)."""

    name: str
    mtu: int
    state: str


@dataclass(frozen=True)
class IbPort:
    """One RDMA port: its device, port number, netdev and state (``ACTIVE`` is up)."""

    dev: str
    port: int
    netdev: str
    state: str


def parse_meminfo(lines: list[str]) -> dict[str, int]:
    """``MemTotal:  123 kB`` lines → {"MemTotal": 123} (kB)."""
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0])
    return out


def parse_links(lines: list[str]) -> list[Link]:
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            out.append(Link(parts[0], int(parts[1]), parts[2]))
    return out


def parse_ibports(lines: list[str]) -> list[IbPort]:
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 4 and parts[1].isdigit():
            netdev = "" if parts[2] == "-" else parts[2]
            out.append(IbPort(parts[0], int(parts[1]), netdev, parts[3]))
    return out


def parse_caches(lines: list[str]) -> dict[str, bool]:
    out = {}
    for line in lines:
        name, _, verdict = line.partition(" ")
        if verdict in ("ok", "fail"):
            out[name] = verdict == "ok"
    return out


def parse_model_rev(lines: list[str]) -> str:
    """The model's commit: an HF snapshot path wins, then the download metadata; else ''."""
    path = next((ln[5:] for ln in lines if ln.startswith("path=")), "")
    m = _SNAPSHOT.search(path)
    if m:
        return m.group(1)
    meta = next((ln[5:].strip() for ln in lines if ln.startswith("meta=")), "")
    return meta if _COMMIT.match(meta) else ""
