"""The rehearsal layer: the declared changes between the launcher's command and the CPU engine's.

The launcher writes `vllm serve` argv and container env for a DGX Spark pair. A few of
those cannot apply to a tiny model on a CPU (the DSpark method, fp8 KV, GPU memory, the
fp8 draft-head overlay); `rehearsal-layer.yaml` names each change and why, and this module
applies exactly those rules and nothing else, returning what it changed so the rank's log
says so. Flags are matched by their long name in both `--name value` and `--name=value`
form; a flag's values are the tokens up to the next `--` token (the launcher's
`pairctl.pair.recipe.serve_argv` writes lists as `--flag a b`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

LAYER_FILE = Path(__file__).resolve().parent / "rehearsal-layer.yaml"
KINDS = {"flag": ("replace", "drop", "add"), "env": ("set",)}


@dataclass(frozen=True)
class Rule:
    kind: str
    name: str
    action: str
    value: str | None
    why: str


@dataclass(frozen=True)
class Change:
    """One applied rule: ``before`` None means added; ``after`` None means dropped."""

    rule: Rule
    before: str | None
    after: str | None

    def line(self) -> str:
        what = f"--{self.rule.name}" if self.rule.kind == "flag" else self.rule.name
        if self.after is None:
            did = f"dropped {what} {self.before or ''}".rstrip()
        elif self.before is None:
            did = f"added {what} {self.after}".rstrip()
        else:
            did = f"{what}: {self.before} -> {self.after}"
        return f"rehearsal layer: {did} ({' '.join(self.rule.why.split())})"


class LayerError(ValueError):
    """The layer file is malformed."""


def load(path: Path = LAYER_FILE) -> list[Rule]:
    data = yaml.safe_load(path.read_text())
    rules = []
    for i, raw in enumerate(data.get("rules") or []):
        kind, action = raw.get("kind"), raw.get("action")
        if kind not in KINDS or action not in KINDS[kind]:
            raise LayerError(f"{path}: rule {i}: kind/action {kind}/{action} not allowed")
        if not raw.get("name") or not str(raw.get("why", "")).strip():
            raise LayerError(f"{path}: rule {i}: every rule needs a name and a why")
        value = raw.get("value")
        if action in ("replace", "set") and value is None:
            raise LayerError(f"{path}: rule {i}: {action} needs a value")
        rules.append(
            Rule(kind, raw["name"], action, None if value is None else str(value), raw["why"])
        )
    return rules


def _split(argv: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """argv → (leading positionals, [(flag name, its value tokens)])."""
    head: list[str] = []
    flags: list[tuple[str, list[str]]] = []
    for tok in argv:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok[2:].partition("=")
            flags.append((name, [val] if eq else []))
        elif flags:
            flags[-1][1].append(tok)
        else:
            head.append(tok)
    return head, flags


def _join(head: list[str], flags: list[tuple[str, list[str]]]) -> list[str]:
    out = list(head)
    for name, vals in flags:
        out += [f"--{name}", *vals]
    return out


def apply(
    rules: list[Rule], argv: list[str], env: Mapping[str, str]
) -> tuple[list[str], dict[str, str], list[Change]]:
    """The engine's argv and env after the rules, and the changes made (in rule order)."""
    head, flags = _split(argv)
    new_env = dict(env)
    changes: list[Change] = []
    for rule in rules:
        if rule.kind == "env":
            before = new_env.get(rule.name)
            if before != rule.value:
                new_env[rule.name] = rule.value or ""
                changes.append(Change(rule, before, rule.value))
            continue
        found = [i for i, (name, _) in enumerate(flags) if name == rule.name]
        if rule.action == "add":
            if not found:
                flags.append((rule.name, [rule.value] if rule.value else []))
                changes.append(Change(rule, None, rule.value or ""))
        elif rule.action == "drop":
            for i in reversed(found):
                changes.append(Change(rule, " ".join(flags[i][1]), None))
                del flags[i]
        elif rule.action == "replace":
            for i in found:
                before = " ".join(flags[i][1])
                if before != rule.value:
                    flags[i] = (rule.name, [rule.value or ""])
                    changes.append(Change(rule, before, rule.value))
    return _join(head, flags), new_env, changes
