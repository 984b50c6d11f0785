"""Every command README.md (and launch/README.md) shows runs as written after the README's
setup (`make test` / `make rehearse` create .venv).

Commands are taken from the READMEs themselves: every line of a ```bash block and every inline
code span that starts like a command (`.venv/bin/python -m`, `python -m`, `python3`,
`launch/dspark_launch.sh`, `./dspark_launch.sh`, `make`, `cp`, `source`, `curl`). Each is
run in the safest form that still proves it works: as written where that is safe (the
performance model, the preflight catalogue, `plan` against a loopback copy of
.env.example, the whole simulator block on loopback), else `--help` of the same module or
launcher command (which fails on a module that does not exist, the ModuleNotFoundError a
fresh machine used to get), `make -n` for make targets, an existence check for files a
command copies or sources, and `bash -n` (the syntax) for the node set-up a Quickstart asks
of the operator on a Spark (`sudo ...`, `newgrp`, a first `ssh FABRIC2`), which changes the
machine or needs the pair and so is never run here. A command no rule covers fails the
test, naming it, so a new README command cannot go unchecked. A bare `python` is the
venv's (the README's `source .venv/bin/activate`).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pairctl.contracts import DEFAULT_RECIPE

REPO = Path(__file__).resolve().parents[1]
READMES = (REPO / "README.md", REPO / "launch" / "README.md")  # the root one and the launcher's
VENV_BIN = Path(sys.executable).parent
PREFIXES = (
    ".venv/bin/python ",
    "python -m ",
    "python3 ",
    "python ",
    "launch/dspark_launch.sh",
    "./dspark_launch.sh",
    "cd launch && ",
    "make ",
    "cp ",
    "source ",
    "curl ",
    "sudo ",
    "newgrp ",
)
# The operator's one-time node set-up (root, a new login, a first ssh contact): never run
# here, its syntax checked.
NODE_SETUP = ("sudo ", "newgrp ", "ssh ")
SIM_BLOCK_MARK = "sim.twin serve"
PYTHON_M = re.compile(r"^(?:\.venv/bin/)?python3? -m (\S+)\s*(.*)$")
DSPARK = re.compile(r"^dspark\s+(.*)$")  # the console script (pyproject's [project.scripts])
LAUNCHER = re.compile(r"^(?:cd launch && )?(?:\./|launch/)dspark_launch\.sh\s*(.*)$")
# Run exactly as written: quick, offline, touching nothing.
AS_WRITTEN = {"perfmodel": "", "pairctl": "preflight --catalogue-md"}


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, commands) per fenced block; continuation lines joined, comments dropped."""
    blocks, lang, cmds, cur = [], None, [], ""
    for line in text.splitlines():
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and lang is None:
            lang, cmds, cur = fence.group(1), [], ""
            continue
        if fence:
            blocks.append((lang, cmds))
            lang = None
            continue
        if lang is None:
            continue
        cur += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            cmd = _strip_comment(cur)
            if cmd:
                cmds.append(re.sub(r"\s+", " ", cmd))
            cur = ""
    return blocks


def inline_commands(text: str) -> list[str]:
    """Code spans outside fenced blocks that start like a command."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    spans = (re.sub(r"\s+", " ", s).strip() for s in re.findall(r"`([^`]+)`", prose))
    return sorted({s for s in spans if s.startswith(PREFIXES) or s == "launch/dspark_launch.sh"})


def readme_commands() -> tuple[list[str], list[str]]:
    """(commands to check one by one, the simulator block's lines)."""
    single, sim = set(), []
    for readme in READMES:
        text = readme.read_text()
        for lang, cmds in fenced_blocks(text):
            if lang not in ("bash", "sh"):
                continue
            if any(SIM_BLOCK_MARK in c for c in cmds):
                sim = cmds
            else:
                single.update(cmds)
        single.update(inline_commands(text))
    return sorted(single), sim


def is_placeholder(word: str) -> bool:
    """`bench.NAME`, `PACKAGE[.module]`, `...`: a template, not a command."""
    return bool(re.search(r"[A-Z]{3,}|\.\.\.|\[", word))


def loopback_env(tmp: Path) -> Path:
    """.env.example with the pair on loopback (tests never name a real address)."""
    text = (REPO / ".env.example").read_text()
    text = re.sub(r"(?m)^SPARK1=.*$", "SPARK1=127.0.0.1", text)
    text = re.sub(r"(?m)^SPARK2=.*$", "SPARK2=127.0.0.2", text)
    env = tmp / "loopback.env"
    env.write_text(text)
    return env


def plan_for(cmd: str, tmp: Path) -> tuple[str, list[str] | None]:
    """How to check one README command: (what, argv) or (why it is not run, None)."""
    py = str(VENV_BIN / "python")
    if cmd.startswith("make "):
        return "make -n", ["make", "-n", *shlex.split(cmd)[1:]]
    if cmd.startswith(("cp ", "source ")):
        return "file exists", ["test", "-f", shlex.split(cmd)[1]]
    if cmd.startswith("curl "):
        return "needs a running pair (the simulator block runs curl)", None
    if cmd.startswith(NODE_SETUP):
        return "node set-up on a Spark: bash -n", ["bash", "-n", "-c", cmd]
    m = PYTHON_M.match(cmd)
    if m:
        module, rest = m.groups()
        if is_placeholder(module):
            return "template (placeholder module name)", None
        if AS_WRITTEN.get(module) == rest:
            return "as written", [py, "-m", module, *shlex.split(rest)]
        return "--help", [py, "-m", module, "--help"]
    m = LAUNCHER.match(cmd)
    if m:
        words = shlex.split(m.group(1))
        if words and words[0].startswith("["):
            return "synopsis (a template of the command line)", None
        launcher = str(REPO / "launch" / "dspark_launch.sh")
        if words[:1] == ["plan"]:
            env = ["--env-file", str(loopback_env(tmp))]
            return "plan on a loopback env", [launcher, "plan", *env, *words[1:]]
        head = words[:1] if words and not words[0].startswith("-") else []
        return "--help", [launcher, *head, "--help"]
    m = DSPARK.match(cmd)
    if m:  # the subcommand's own --help: its words up to the first option
        words = shlex.split(m.group(1))
        head = list(itertools.takewhile(lambda w: not w.startswith("-"), words))
        return "--help", [str(VENV_BIN / "dspark"), *head, "--help"]
    if cmd.startswith(("python3 ", "python ")):  # a script path: must run (at least --help)
        return "--help", [py, *shlex.split(cmd)[1:2], "--help"]
    return "UNCLASSIFIED", None


COMMANDS, SIM_BLOCK = readme_commands()


def test_readme_has_commands_to_check() -> None:
    assert len(COMMANDS) >= 10 and SIM_BLOCK, (COMMANDS, SIM_BLOCK)


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[:60])
def test_readme_command_runs(cmd: str, tmp_path: Path) -> None:
    how, argv = plan_for(cmd, tmp_path)
    assert how != "UNCLASSIFIED", f"README command {cmd!r} matches no rule in {__file__}"
    if argv is None:  # a template or a line that needs a real pair: classified, nothing to run
        return
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    p = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert p.returncode == 0, (
        f"README command {cmd!r} ({how}: {shlex.join(argv)}) exited {p.returncode}:\n"
        f"{p.stdout[-1500:]}\n{p.stderr[-1500:]}"
    )


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_readme_simulator_block_runs_as_written() -> None:
    """The README's try-it-without-hardware block, line for line, on loopback."""
    script = "\n".join(SIM_BLOCK)
    if not _port_free(18000):  # someone else's twin: same block, another port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            script = script.replace("18000", str(s.getsockname()[1]))
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    proc = subprocess.Popen(
        ["bash", "-e", "-c", script],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the block's own `kill %1` ran if it finished
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"README simulator block failed ({proc.returncode}):\n{out}"
    assert "quality gate: 5/5 passed" in out and "SIMULATOR" in out.upper(), out


@pytest.mark.parametrize(
    "broken",
    [
        "python3 scripts/spark_twin.py truth",  # what the README once said: no such file now
        ".venv/bin/python -m bench.no_such_bench --url http://127.0.0.1:8000",
        "launch/dspark_launch.sh frobnicate",
        'sudo usermod -aG docker "$USER',  # an unterminated quote: bash -n refuses it
    ],
)
def test_a_broken_readme_command_would_fail(broken: str, tmp_path: Path) -> None:
    """The rules run each command for real: a command that cannot work fails the check."""
    how, argv = plan_for(broken, tmp_path)
    assert argv is not None, how
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, (broken, p.stdout)


# --- the Quickstart's path per engine stack --------------------------------------------

STACK_PATHS_HEADING = "### A path per engine stack"
STACK_PATHS = ("fork", "upstream", "cpu")  # recipes/stacks/NAME.yaml, the rehearsal's is cpu
# The fixed start of each success line the paths quote -> (the file that prints it, the text
# that file must contain): a line the code cannot print sends an operator looking for it.
SUCCESS_PRINTERS = {
    "IMAGE = sha256:": ("pairctl/engine/imageship.py", "on both ranks ("),
    "dsv4 engine image ok: ": ("launch/image/Dockerfile", 'print("dsv4 engine image ok: vLLM"'),
    "healthy after ": (
        "pairctl/lifecycle/steps.py",
        'f"healthy after {elapsed}: {base}/v1 serving',
    ),
    "image check passed: ": ("launch/image/upstream/check_image.py", '"image check passed: '),
    "PATCH FAILED": ("launch/image/upstream/patches/_patchlib.py", '"PATCH FAILED {exc}"'),
    "IMAGE CHECK FAILED": ("launch/image/upstream/check_image.py", '"IMAGE CHECK FAILED: '),
    "reply done: ": ("sim/rehearsal/rehearse.py", 'say(f"reply done: {res.chunks} chunks, usage'),
    "[rehearse ": ("sim/rehearsal/rehearse.py", 'say("rehearsal passed")'),
}


def stack_paths() -> dict[str, str]:
    """Each stack's bullet of the README's per-stack Quickstart paths, by stack name."""
    text = (REPO / "README.md").read_text()
    assert STACK_PATHS_HEADING in text, f"README lacks {STACK_PATHS_HEADING!r}"
    section = text.split(STACK_PATHS_HEADING, 1)[1]
    section = re.split(r"\n(?=#|\d+\. )", section, maxsplit=1)[0]
    bullets = re.findall(r"^- \*\*`([a-z-]+)`\*\*(.*?)(?=^- \*\*`|\Z)", section, re.S | re.M)
    return {name: re.sub(r"\s+", " ", body) for name, body in bullets}


def test_the_quickstart_has_a_path_per_stack_with_time_and_success() -> None:
    paths = stack_paths()
    assert sorted(paths) == sorted(STACK_PATHS)
    stacks_dir = REPO / "recipes" / "stacks"
    if stacks_dir.is_dir():  # the declared stacks, once they are declared
        assert set(paths) <= {p.stem for p in stacks_dir.glob("*.yaml")}
    for name, body in paths.items():
        assert re.search(r"~?\d+(\.\d+)? min", body), f"{name}: no time"
        assert "Success:" in body, name
        quoted = [
            s for s in re.findall(r"`([^`]+)`", body) if s.startswith(tuple(SUCCESS_PRINTERS))
        ]
        assert quoted, f"{name}: no success line the code prints"
        for line in quoted:
            key = next(k for k in SUCCESS_PRINTERS if line.startswith(k))
            path, text = SUCCESS_PRINTERS[key]
            assert text in (REPO / path).read_text(), (name, line, path)


def test_the_success_lines_match_what_the_code_prints() -> None:
    """The versions, counts and names the lines quote are the ones the code has."""
    paths = stack_paths()
    dockerfile = (REPO / "launch" / "image" / "upstream" / "Dockerfile").read_text()

    def arg(name: str) -> str:
        m = re.search(rf"^ARG {name}=(\S+)$", dockerfile, re.M)
        assert m, name
        return m.group(1)

    check = next(s for s in re.findall(r"`([^`]+)`", paths["upstream"]) if "image check" in s)
    imports = len(re.findall(r"--import \S+", dockerfile))
    assert check.startswith(f"image check passed: vllm {arg('VLLM_VERSION')}, torch ")
    assert f"torch {arg('TORCH_VERSION')}" in check
    assert f"flashinfer {arg('FLASHINFER_VERSION')}; {imports} import(s) resolved" in check
    served = re.search(r"^\s+served-model-name: (\S+)$", DEFAULT_RECIPE.read_text(), re.M)
    assert served and f"serving {served.group(1)}`" in paths["fork"]
    assert "`make rehearse`" in paths["cpu"] and "rehearsal passed" in paths["cpu"]
