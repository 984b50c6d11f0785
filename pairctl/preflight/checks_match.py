"""Do both nodes carry the same bits? Image, model files and the shipped overlays.

TP=2 needs both ranks to load identical weights with identical code: a differing image or
tokenizer boots, then fails later and further from the cause.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from pairctl.engine.image import digest_pinned, node_ref
from pairctl.nodes.docker_access import group_fix, permission_denied
from pairctl.preflight.check import FAIL, PASS, WARN, Check, CheckSpec, Need
from pairctl.preflight.evidence import NodeEvidence
from pairctl.preflight.probe import MODEL_FILES

PF_IMAGE_MATCH = CheckSpec(
    "PF-IMAGE-MATCH",
    title="the same image ID on both nodes, and no registry digest (RepoDigests) that "
    "differs between them; a tag that could be pinned by its digest WARNs",
    remedy="run launch/dspark_launch.sh image ship (add --build to build launch/image/Dockerfile "
    "on rank 0, or --pull for a registry image): it copies rank 0's image to rank 1 and checks "
    "the ID on both; pin IMAGE=repo@sha256:DIGEST in the env file so a later pull cannot "
    "change one node",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_image(v.pair.image, v.rank0, v.rank1),
)


def _missing(image: str, rank: int, ev: NodeEvidence) -> str:
    """Why ``rank`` has no image ID: docker refused the user, or the image (under the
    name that node uses for it) is not there."""
    if permission_denied(ev.image_error):
        return group_fix(rank)
    local = node_ref(image, rank)
    if local != image:
        return (
            f"rank {rank} has no {local} (the name image ship gives the digest-pinned "
            f"{image} there after docker load, which leaves it untagged)"
        )
    return f"{image} not found on rank {rank}"


def check_image(image: str, n0: NodeEvidence, n1: NodeEvidence) -> Check:
    ids = {0: n0.image_id, 1: n1.image_id}
    missing = [_missing(image, r, ev) for r, ev in ((0, n0), (1, n1)) if not ids[r]]
    if missing:
        return PF_IMAGE_MATCH.verdict(FAIL, "; ".join(missing))
    if ids[0] != ids[1]:
        return PF_IMAGE_MATCH.verdict(FAIL, f"{image}: rank 0 {ids[0]} != rank 1 {ids[1]}")
    d0 = n0.image_facts.digests() if n0.image_facts else set()
    d1 = n1.image_facts.digests() if n1.image_facts else set()
    if d0 and d1 and not d0 & d1:
        return PF_IMAGE_MATCH.verdict(
            FAIL, f"{image}: registry digests differ: rank 0 {sorted(d0)}, rank 1 {sorted(d1)}"
        )
    digest = sorted(d0 & d1 or d0 | d1)
    if digest and not digest_pinned(image):
        refs = n0.image_facts.repo_digests if n0.image_facts else []
        ref = next((r for r in refs if r.endswith(digest[0])), digest[0])
        return PF_IMAGE_MATCH.verdict(
            WARN, f"{image} = {ids[0]} on both, but by tag: pin IMAGE={ref}"
        )
    how = f"digest {digest[0]}" if digest else "no registry digest (built or loaded locally)"
    return PF_IMAGE_MATCH.verdict(PASS, f"{image} = {ids[0]} on both; {how}")


PF_MODEL_MATCH = CheckSpec(
    "PF-MODEL-MATCH",
    title=f"MODEL_PATH exists on both nodes with identical {', '.join(MODEL_FILES)} "
    "(sha256; config.json required)",
    remedy="run launch/dspark_launch.sh model fetch (downloads on rank 0, copies to rank 1 "
    "and verifies), or copy the model to the same path on both nodes, then re-run",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_model(v.pair.model_path, v.rank0, v.rank1),
)


def model_fingerprint(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}={files[name]}\n".encode())
    return h.hexdigest()[:16]


def check_model(path: str, n0: NodeEvidence, n1: NodeEvidence) -> Check:
    probs = []
    for rank, ev in ((0, n0), (1, n1)):
        if not ev.model_dir:
            probs.append(f"rank {rank}: {path} missing")
        elif "config.json" not in ev.model_files:
            probs.append(f"rank {rank}: {path}/config.json missing")
    if probs:
        return PF_MODEL_MATCH.verdict(FAIL, "; ".join(probs))
    f0, f1 = n0.model_files, n1.model_files
    if f0 != f1:
        diff = sorted(k for k in set(f0) | set(f1) if f0.get(k) != f1.get(k))
        return PF_MODEL_MATCH.verdict(FAIL, f"files differ between nodes: {', '.join(diff)}")
    return PF_MODEL_MATCH.verdict(
        PASS, f"{len(f0)} files, fingerprint {model_fingerprint(f0)} on both"
    )


PF_OVERLAYS = CheckSpec(
    "PF-OVERLAYS",
    title="OVERLAY_DIR on both nodes has every file mods/dsv4-flash-overlays ships, "
    "sha256-identical; other files there are ignored (WARN only)",
    remedy="run launch/dspark_launch.sh sync-overlays --env-file FILE",
    needs=(Need.CONFIG, Need.OVERLAY_SRC, Need.RANK0, Need.RANK1),
    decide=lambda v: check_overlays(v.pair.overlay_dir, v.overlay_want, v.rank0, v.rank1),
)


def check_overlays(path: str, want: Mapping[str, str], n0: NodeEvidence, n1: NodeEvidence) -> Check:
    """``want``: shipped file -> sha256 from the repo. Files a node has beyond it don't count."""
    probs = []
    for rank, ev in ((0, n0), (1, n1)):
        if not ev.overlay_dir:
            probs.append(f"rank {rank}: {path} missing (boots without overlays)")
            continue
        have = ev.overlay_files
        miss = sorted(set(want) - set(have))
        diff = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        if miss:
            probs.append(f"rank {rank}: missing {', '.join(miss[:5])}")
        if diff:
            probs.append(f"rank {rank}: differs from repo: {', '.join(diff[:5])}")
    if probs:
        return PF_OVERLAYS.verdict(WARN, "; ".join(probs))
    return PF_OVERLAYS.verdict(PASS, f"{len(want)} files match on both")


PF_MODEL_REVISION = CheckSpec(
    "PF-MODEL-REVISION",
    title="the model's Hugging Face commit (from an HF cache snapshot path, or the download "
    "metadata of `hf download --local-dir`) is the same on both nodes and equals "
    "MODEL_REVISION; an unpinned or unknown revision WARNs",
    remedy="set MODEL_REVISION=COMMIT in the env file and run launch/dspark_launch.sh model "
    "fetch: it downloads MODEL_REPO at that commit on rank 0 (hf download --local-dir "
    "MODEL_PATH), copies it to rank 1 and verifies both copies",
    needs=(Need.CONFIG, Need.RANK0, Need.RANK1),
    decide=lambda v: check_model_revision(v.pair.model_revision, v.rank0, v.rank1),
)


def check_model_revision(pinned: str, n0: NodeEvidence, n1: NodeEvidence) -> Check:
    revs = {0: n0.model_revision, 1: n1.model_revision}
    known = {r: v for r, v in revs.items() if v}
    if len(known) == 2 and revs[0] != revs[1]:
        return PF_MODEL_REVISION.verdict(
            FAIL, f"model revisions differ: rank 0 {revs[0]}, rank 1 {revs[1]}"
        )
    if pinned:
        off = [f"rank {r} {v or 'unknown'}" for r, v in revs.items() if v != pinned]
        if off:
            return PF_MODEL_REVISION.verdict(FAIL, f"MODEL_REVISION={pinned}, but {'; '.join(off)}")
        return PF_MODEL_REVISION.verdict(PASS, f"{pinned} on both (pinned)")
    if len(known) == 2:
        return PF_MODEL_REVISION.verdict(
            WARN, f"{revs[0]} on both, not pinned: set MODEL_REVISION={revs[0]}"
        )
    unknown = [f"rank {r}" for r, v in revs.items() if not v]
    return PF_MODEL_REVISION.verdict(
        WARN, f"revision unknown on {', '.join(unknown)} and MODEL_REVISION not set"
    )
