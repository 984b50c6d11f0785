"""Is the server that answered this pair's rank 0 of this boot? One proof for ``status``
and ``watch``.

A label alone ("a container labelled for this pair runs on SPARK1") does not tie that
container to the server that answered: in the seed's incident pair B's SPARK1 pointed at
pair A's head, and B's watchdog ran its canary and its restarts against A. So ``up`` draws a
boot id, labels both ranks ``dsv4.boot=<id>`` and, on a stack that declares
``boot_identity: fingerprint``, starts rank 0 with ``--fingerprint-mode custom
--fingerprint-value dsv4/<PAIR_ID>/<id>`` (pairctl.pair.plan.identity_args): vLLM returns
that string as ``system_fingerprint`` on every non-streaming reply
(vllm/entrypoints/serve/utils/fingerprint.py). The proof compares the fingerprint of the
1-token probe's completion with the boot label of this pair's running rank-0 container on
SPARK1 (label-selected ``docker ps``).

Outcomes: ``proven``; ``disproven`` (another pair's fingerprint, another boot of ours, a
non-dsv4 fingerprint, or a server that refuses our key where no container of ours runs:
what answered is named); ``unavailable`` (the stack has no boot identity, the container
predates it, or docker could not be asked): the label proof stands in and says it is weaker.
"""

from __future__ import annotations

from dataclasses import dataclass

from pairctl.nodes.docker import pair_containers
from pairctl.nodes.ssh import Node
from pairctl.pair.plan import LABEL_BOOT, boot_fingerprint, container_name
from pairctl.status.watch import Answer, KeyRejected, probe_answer

PROVEN, DISPROVEN, UNAVAILABLE = "proven", "disproven", "unavailable"
PREFIX = "dsv4/"


@dataclass(frozen=True)
class Head:
    """This pair's rank-0 container on SPARK1, as docker (label-selected) tells it."""

    reachable: bool  # docker answered there
    running: bool  # dsv4-<PAIR_ID>-rank0 runs
    boot: str | None  # its dsv4.boot label (None: none, or not running)
    error: str = ""  # why docker could not be asked


@dataclass(frozen=True)
class Proof:
    """The verdict, and the sentence that says why."""

    outcome: str  # proven | disproven | unavailable
    detail: str
    label_holds: bool = False  # (unavailable) the weaker label proof holds

    @property
    def ours(self) -> bool:
        """Whether status and watch may treat the server as this pair's."""
        return self.outcome == PROVEN or (self.outcome == UNAVAILABLE and self.label_holds)


def head_of(node: Node, pair_id: str) -> Head:
    """Ask SPARK1's docker for this pair's rank-0 container and its boot label."""
    found, res = pair_containers(node, pair_id)
    if res.rc != 0:
        return Head(False, False, None, (res.err or res.out).strip()[-300:] or f"rc={res.rc}")
    name = container_name(pair_id, 0)
    mine = next((c for c in found if c.name == name and c.running), None)
    if mine is None:
        return Head(True, False, None)
    return Head(True, True, mine.labels.get(LABEL_BOOT) or None)


def _label_only(pair_id: str, head: Head, why: str) -> Proof:
    """The fallback: a container labelled for this pair runs on SPARK1 (weaker)."""
    if not head.reachable:
        return Proof(UNAVAILABLE, f"{why}; docker on SPARK1 could not be asked ({head.error})")
    if head.running:
        return Proof(
            UNAVAILABLE,
            f"{why}; only the weaker label proof holds (a container labelled dsv4.pair="
            f"{pair_id} runs on SPARK1, which does not prove it is what answered)",
            label_holds=True,
        )
    return Proof(DISPROVEN, f"{why}; and no container of pair {pair_id} runs on SPARK1")


def judge(pair_id: str, identity: bool, fingerprint: str | None, head: Head) -> Proof:
    """The proof from the completion's ``system_fingerprint`` and SPARK1's docker.

    ``identity``: the stack declares ``boot_identity: fingerprint``."""
    seen = repr(fingerprint) if fingerprint is not None else "none (null)"
    if not identity:
        return _label_only(pair_id, head, "this stack exposes no boot identity")
    owner, _, boot = (fingerprint or "").removeprefix(PREFIX).partition("/")
    if fingerprint is None or not fingerprint.startswith(PREFIX) or not boot:
        if head.running and head.boot is None:  # started before boot identities existed
            return _label_only(pair_id, head, "the running rank 0 carries no dsv4.boot label")
        return Proof(
            DISPROVEN,
            f"the server that answered is not a dsv4 pair's head (system_fingerprint {seen})",
        )
    if owner != pair_id:
        return Proof(DISPROVEN, f"pair {owner}'s head answered (system_fingerprint {seen})")
    if not head.reachable:
        return Proof(
            UNAVAILABLE,
            f"pair {pair_id}'s boot {boot} answered, but docker on SPARK1 could not be asked "
            f"for the running boot ({head.error})",
        )
    if not head.running:
        return Proof(
            DISPROVEN,
            f"boot {boot} of pair {pair_id} answered, but no rank 0 of this pair runs on "
            "SPARK1: another host serves an old boot of ours",
        )
    if head.boot is None:
        return _label_only(pair_id, head, "the running rank 0 carries no dsv4.boot label")
    if head.boot != boot:
        return Proof(
            DISPROVEN,
            f"boot {boot} of pair {pair_id} answered, but the rank 0 running on SPARK1 is boot "
            f"{head.boot}: another server of an older boot holds the endpoint",
        )
    return Proof(PROVEN, f"system_fingerprint {boot_fingerprint(pair_id, boot)} is this boot's")


def judge_refused(pair_id: str, url: str, head: Head) -> Proof:
    """The server answered 401/403 to our key: ours with a wrong key, or another pair's head."""
    if head.reachable and not head.running:
        return Proof(
            DISPROVEN,
            f"the server at {url} refused our key and no container of pair {pair_id} runs on "
            "SPARK1: it may be another pair's head (check SPARK1 and PORT in the env file)",
        )
    why = f"the server at {url} refused our key"
    return _label_only(pair_id, head, why)


def judge_answer(
    pair_id: str, identity: bool, url: str, answer: Answer, refused: bool, head: Head
) -> Proof:
    """The proof from one probe: refused (401/403), a completion, or no completion at all
    (then only the label proof can stand in)."""
    if refused:
        return judge_refused(pair_id, url, head)
    if not answer.completed:
        return _label_only(pair_id, head, f"no completion answered ({answer.why})")
    return judge(pair_id, identity, answer.fingerprint, head)


class Prover:
    """``watch``'s probe and proof in one: ``probe`` is the Watchdog's probe (it keeps the
    answer), ``foreign`` its owner check (why the server is not ours, or None)."""

    def __init__(
        self, base: str, timeout: float, api_key: str, pair_id: str, identity: bool, node: Node
    ) -> None:
        self.base, self.timeout, self.api_key = base, timeout, api_key
        self.pair_id, self.identity, self.node = pair_id, identity, node
        self.answer: Answer = Answer(None)
        self.refused: KeyRejected | None = None

    def probe(self) -> str | None:
        self.refused = None
        try:
            self.answer = probe_answer(self.base, self.timeout, self.api_key)
        except KeyRejected as exc:
            self.refused, self.answer = exc, Answer(str(exc))
        return self.answer.why

    def foreign(self) -> str | None:
        """None when the server may be acted on; raises ``KeyRejected`` when our own
        server refuses our key (watch stops with exit 9, as before)."""
        if self.refused is None and not self.answer.completed:
            return None  # nothing answered a completion: a failure, judged as one
        head = head_of(self.node, self.pair_id)
        url = f"{self.base}/v1"
        proof = judge_answer(
            self.pair_id, self.identity, url, self.answer, self.refused is not None, head
        )
        if proof.outcome == DISPROVEN:
            return proof.detail
        if self.refused is not None:
            raise self.refused
        return None
