"""`dspark`'s registry and dispatch, in-process: every bench script is registered, every
registered module has the add_cli_args/main pair, and a subcommand's flags are its
module's (the same parser `python -m MODULE` builds)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from pairctl.cli import dspark, frontdoor
from pairctl.cli.registry import BENCHES, GROUPS, Command

REPO = Path(__file__).resolve().parents[1]


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin)


def _functions(module: str) -> set[str]:
    """The module's top-level functions, and names bound to one (``x = other.x``)."""
    tree = ast.parse(_source(module).read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        if isinstance(n, ast.ImportFrom):
            names |= {a.asname or a.name for a in n.names}
    return names


def _commands() -> list[tuple[str, Command]]:
    out = []
    for name, entry in GROUPS.items():
        items = entry.items() if isinstance(entry, dict) else [("", entry)]
        out += [(f"{name} {n}".strip(), c) for n, c in items]
    return out


def test_every_bench_script_with_a_main_is_registered() -> None:
    scripts = set()
    for path in [*REPO.glob("bench/*.py"), *REPO.glob("bench/kernels/*.py")]:
        if 'if __name__ == "__main__"' in path.read_text():
            scripts.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    scripts.add("bench.kernels.fp8_tune.tune")  # the package's __main__ runs tune.main
    assert scripts == {c.module for c in BENCHES.values()}


@pytest.mark.parametrize("name,cmd", _commands(), ids=[n for n, _ in _commands()])
def test_every_command_module_has_its_pair(name: str, cmd: Command) -> None:
    have = _functions(cmd.module)
    assert "main" in have, name
    if not cmd.argv:
        assert "add_cli_args" in have, f"{name}: {cmd.module} has no add_cli_args"


def test_a_bench_gets_the_shared_flags_and_its_own(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        dspark.main(["bench", "ctx", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: dspark bench ctx")
    assert "--depths" in out and "--guard-interval-ms" in out and "--url" in out


def test_a_bad_flag_is_exit_2_naming_it(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        dspark.main(["perfmodel", "--accept", "0.5,0.5", "--gamma", "3"])
    assert exc.value.code == 2 and "--accept needs 1 or gamma=3" in capsys.readouterr().err


def test_perfmodel_runs_from_the_namespace(capsys: pytest.CaptureFixture) -> None:
    assert dspark.main(["perfmodel", "--accept", "0.85"]) == 0
    assert "tok/s" in capsys.readouterr().out


def test_the_pair_commands_are_the_front_doors(capsys: pytest.CaptureFixture) -> None:
    assert dspark.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: dspark [up|") and "bench NAME" in out
    assert dspark.main(["plan", "--gate"]) == 2
    assert "--gate does not apply to plan (only to: up)" in capsys.readouterr().err


def test_the_command_may_stand_anywhere_and_json_takes_a_file() -> None:
    a = frontdoor.parse(["--json", "out.json", "--timeout=5", "up", "--", "--max-num-seqs", "8"])
    assert (a.cmd, a.json_file, a.json, a.timeout) == ("up", "out.json", False, 5)
    assert a.vllm_args == ["--max-num-seqs", "8"]
    a = frontdoor.parse(["--json", "status"])
    assert (a.cmd, a.json, a.json_file) == ("status", True, None)
    a = frontdoor.parse(["--tail", "5", "logs", "--rank", "1", "-f"])
    assert (a.cmd, a.tail, a.rank, a.follow) == ("logs", 5, 1, True)
    assert frontdoor.parse([]).cmd == "up"
    assert frontdoor.parse(["model", "verify", "--checksum"]).action == "verify"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["up", "--timeout"], "--timeout needs a value (see --help)"),
        (["up", "--gate=yes"], "--gate takes no value (see --help)"),
        (["up", "--timeout", "0"], "--timeout must be at least 1 second, got '0'"),
        (["plan", "down"], "two commands given ('plan' and 'down')"),
        (["image"], "image needs one of: ship (got nothing); e.g. image ship"),
        (["plan", "--bogus"], "unknown argument '--bogus' (see --help)"),
    ],
)
def test_usage_errors_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(frontdoor.UsageError) as exc:
        frontdoor.parse(argv)
    assert message in str(exc.value)
