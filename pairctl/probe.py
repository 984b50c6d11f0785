"""Evidence collection for preflight: one POSIX sh script per node, parsed into a dict.

The script only reads (plus ``mkdir -p`` of the TileLang cache dir, which the issue asks
preflight to create). Its output is plain sections so recorded evidence can be replayed in
unit tests of the decisions in ``pairctl.preflight``.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from pairctl.config import PairConfig
from pairctl.docker import parse_ps
from pairctl.nodes import Node
from pairctl.plan import LABEL_PAIR
from pairctl.roce import PROBE_SECTION as _ROCE_SECTION
from pairctl.roce import parse_gids

MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")

_SCRIPT = r"""
sec() { printf '\n==== %s ====\n' "$1"; }
sec hostname; hostname 2>/dev/null || cat /proc/sys/kernel/hostname
sec addrs; ip -o addr show 2>/dev/null | awk '{print $4}'
sec netdevs; ls /sys/class/net 2>/dev/null
sec ibdevs
for d in /sys/class/infiniband/*; do
  [ -e "$d" ] && printf '%s %s\n' "${d##*/}" "$(readlink -f "$d/device" 2>/dev/null)"
done
sec listen; ss -Htln 2>/dev/null | awk '{print $4}'; echo "rc=$?"
sec docker_ps
docker ps -a --no-trunc --filter "label=$LABEL" --format '{{json .}}' 2>&1; echo "rc=$?"
sec image; docker image inspect --format '{{.Id}}' "$IMAGE" 2>&1; echo "rc=$?"
sec model
if [ -d "$MODEL" ]; then echo "dir=yes"; else echo "dir=no"; fi
for f in $MODEL_FILES; do
  if [ -f "$MODEL/$f" ]; then echo "$(sha256sum < "$MODEL/$f" | cut -d' ' -f1) $f"; fi
done
sec tilelang
if mkdir -p "$TL" 2>/dev/null && [ -w "$TL" ]; then echo ok; else echo fail; fi
sec overlays
if [ -d "$OV" ]; then
  echo "dir=yes"
  (cd "$OV" && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
     ! -path '*.egg-info/*' ! -path './build/*' -exec sha256sum {} + 2>/dev/null | sort -k2)
else echo "dir=no"; fi
"""  # the RoCE GID table and the end marker follow

_SCRIPT += _ROCE_SECTION + "sec end\n"


def probe_script(cfg: PairConfig, image: str) -> str:
    """The probe with this pair's values bound as shell variables (safely quoted)."""
    binds = {
        "LABEL": LABEL_PAIR,
        "IMAGE": image,
        "MODEL": cfg.MODEL_PATH,
        "MODEL_FILES": " ".join(MODEL_FILES),
        "TL": cfg.TILELANG_CACHE_DIR,
        "OV": cfg.OVERLAY_DIR,
    }
    head = "".join(f"{k}={shlex.quote(v)}\n" for k, v in binds.items())
    return head + _SCRIPT


def split_sections(text: str) -> dict[str, list[str]]:
    """``==== name ====`` blocks → {name: lines}."""
    out: dict[str, list[str]] = {}
    cur: str | None = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("==== ") and s.endswith(" ===="):
            cur = s[5:-5].strip()
            out[cur] = []
        elif cur is not None and s:
            out[cur].append(s)
    return out


def _rc(lines: list[str]) -> tuple[int | None, list[str]]:
    if lines and lines[-1].startswith("rc="):
        try:
            return int(lines[-1][3:]), lines[:-1]
        except ValueError:
            pass
    return None, lines


def _digests(lines: list[str]) -> dict[str, str]:
    """``sha256 name`` lines of a section (``dir=`` markers skipped) → {name: digest}."""
    out = {}
    for line in lines:
        if line.startswith("dir="):
            continue
        digest, _, name = line.partition(" ")
        out[name.strip().removeprefix("./")] = digest
    return out


def parse_probe(text: str) -> dict[str, Any]:
    """Parse the probe's stdout into evidence (JSON-serialisable)."""
    sec = split_sections(text)
    ev: dict[str, Any] = {"complete": "end" in sec}
    ev["hostname"] = (sec.get("hostname") or [""])[0]
    ev["addrs"] = sorted({a.split("/")[0] for a in sec.get("addrs", [])})
    ev["netdevs"] = sorted(sec.get("netdevs", []))
    ib: dict[str, str] = {}
    for line in sec.get("ibdevs", []):
        name, _, dev = line.partition(" ")
        ib[name] = dev
    ev["ibdevs"] = ib
    _, listen = _rc(sec.get("listen", []))
    ports = set()
    for addr in listen:
        tail = addr.rsplit(":", 1)[-1]
        if tail.isdigit():
            ports.add(int(tail))
    ev["listen_ports"] = sorted(ports)
    rc, ps_lines = _rc(sec.get("docker_ps", []))
    ev["docker_ps_rc"] = rc
    ev["containers"] = [
        {"id": c.id, "name": c.name, "state": c.state, "labels": c.labels}
        for c in parse_ps("\n".join(ps_lines))
    ]
    ev["docker_ps_error"] = "" if rc == 0 else " ".join(ps_lines)[:300]
    rc, img = _rc(sec.get("image", []))
    ev["image_id"] = img[0] if rc == 0 and img else None
    ev["image_error"] = "" if rc == 0 else " ".join(img)[:300]
    model = sec.get("model", [])
    ev["model_dir"] = "dir=yes" in model
    ev["model_files"] = _digests(model)
    ev["tilelang_ok"] = (sec.get("tilelang") or [""])[0] == "ok"
    ov = sec.get("overlays", [])
    ev["overlay_dir"] = "dir=yes" in ov
    ev["overlay_files"] = _digests(ov)
    ev["roce_gids"] = parse_gids(sec.get("roce_gids", []))
    return ev


def collect(node: Node, cfg: PairConfig, image: str) -> dict[str, Any]:
    """Run the probe on a node; evidence plus how the transport went."""
    res = node.run_script(probe_script(cfg, image), timeout=60)
    ev = parse_probe(res.out)
    ev["rc"] = res.rc
    ev["stderr"] = res.err.strip()[-600:]
    ev["reachable"] = ev["complete"] or (res.rc not in (255, 124, 127) and bool(res.out))
    return ev


def dumps(evidence: dict[str, Any]) -> str:
    return json.dumps(evidence, indent=2, sort_keys=True)
