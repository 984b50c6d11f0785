"""The rehearsal's refusal step: preflight on a deliberately mismatched image.

The CPU-engine pair runs the ``cpu`` stack (vLLM 0.32.0, recipes/stacks/cpu.yaml). Both test
hosts also get the simulator image, whose python3 is real vLLM 0.33 (pairenv.SIM_IMAGE_PATH);
an env file that is the pair's own but for ``IMAGE=`` that image is then what an operator
gets by pointing a pair at the wrong image. The unchanged launcher's ``preflight`` must
refuse it (exit 3) on PF-IMAGE-STACK, naming both versions and the stack the image is, after
the image probe ran the image's own interpreter on both hosts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pairctl.contracts import EXIT_PREFLIGHT
from pairctl.engine.stack import load_stack
from pairctl.home import project_root
from pairctl.preflight.imagejudge import vllm_wanted
from sim.rehearsal import hosts, pairenv

REPO = project_root()
LAUNCHER = REPO / "launch" / "dspark_launch.sh"
CHECK = "PF-IMAGE-STACK"


class Refusal(RuntimeError):
    """The mismatched image was not refused as it must be."""


def mismatched_env(env_file: Path) -> Path:
    """The pair's env file with IMAGE= the simulator image (every other value the same)."""
    lines = [ln for ln in env_file.read_text().splitlines() if not ln.startswith("IMAGE=")]
    out = env_file.with_name(env_file.stem + "-mismatched.env")
    out.write_text("\n".join([*lines, f"IMAGE={pairenv.IMAGE}"]) + "\n")
    return out


def expected() -> str:
    """The words PF-IMAGE-STACK must say (pairctl/preflight/checks_image.py check_stack)."""
    return (
        f"the pair's stack cpu runs vLLM {vllm_wanted(load_stack('cpu'))}, but {pairenv.IMAGE} "
        "runs vLLM 0.33.0 (rank 0 and rank 1), which is stack upstream"
    )


def refuse(pair: hosts.Pair, say: Callable[[str], None]) -> str:
    """Load the simulator image on both hosts, run preflight against it, and return the
    PF-IMAGE-STACK line; raises Refusal unless preflight exits 3 with that mismatch."""
    assert pair.env_file is not None
    want = expected()
    for host in pair.hosts:
        pairenv.load_image(host)
    env_file = mismatched_env(pair.env_file)
    argv = [str(LAUNCHER), "preflight", "--env-file", str(env_file)]
    say(f"host 1 $ {' '.join(argv)}  (IMAGE={pairenv.IMAGE}: must be refused)")
    res = pair.h1.run(argv, env={"PYTHONUNBUFFERED": "1"}, cwd=str(REPO / "launch"), timeout=900)
    lines = [ln for ln in res.stdout.splitlines() if CHECK in ln]
    line = next((ln for ln in lines if ln.startswith("FAIL")), "")
    if res.returncode != EXIT_PREFLIGHT or want not in line:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
        raise Refusal(
            f"preflight with {pairenv.IMAGE} exited {res.returncode} (want {EXIT_PREFLIGHT}, "
            f"{CHECK} FAIL: {want}):\n{tail}"
        )
    say(f"refused as it must be: {line.strip()}")
    return line
