"""tests/support/warm.py: a script run warm is the script run by a new interpreter.

Each case runs the same script both ways, a plain child process and a fork of the warm
server, and compares what a caller sees: exit status, standard streams, argv, working
directory, environment, sys.path and which packages were imported before the script began.
The servers here preload small standard-library and project targets, not vLLM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import warm

TARGETS = ("email.mime.text", "pairctl.pair.recipe")  # pairctl's is yaml, a third-party import


@pytest.fixture(autouse=True)
def _own_servers():
    yield
    warm.close_all(TARGETS)


def both(argv: list[str], **kw) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    env = kw.pop("env", None)
    plain = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60, **kw
    )
    served = warm.run(sys.executable, argv, env=env, timeout=60, targets=TARGETS, **kw)
    return plain, served


REPORT = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                      "env": {k: v for k, v in os.environ.items() if k.startswith("WARM_")},
                      "stdin": sys.stdin.read()}))
    print("to stderr", file=sys.stderr)
    """
)


@pytest.mark.parametrize(
    ("code", "rc", "err"),
    [
        ("pass", 0, ""),
        ("import sys; sys.exit(3)", 3, ""),
        ("import sys; sys.exit('refused: why')", 1, "refused: why\n"),
        ("raise KeyError('k')", 1, "KeyError: 'k'\n"),
    ],
)
def test_exit_status_and_stderr_are_a_new_interpreters(code: str, rc: int, err: str) -> None:
    plain, served = both(["-c", code])
    assert plain.returncode == served.returncode == rc
    assert plain.stderr.endswith(err) and served.stderr.endswith(err)


def test_argv_cwd_environment_and_stdin_are_the_requests(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "WARM_A": "1", "WARM_B": "two words"}
    plain, served = both(["-c", REPORT, "x", "--y"], env=env, cwd=tmp_path, input="in")
    assert plain.returncode == served.returncode == 0, served.stderr
    assert json.loads(served.stdout) == json.loads(plain.stdout)
    assert json.loads(served.stdout)["argv"] == ["-c", "x", "--y"]
    assert served.stderr == plain.stderr == "to stderr\n"
    # a variable the worker has but the request leaves out is not in the script's
    again = warm.run(sys.executable, ["-c", REPORT], env={"PATH": "/usr/bin"}, targets=TARGETS)
    assert json.loads(again.stdout)["env"] == {}


def test_a_module_on_pythonpath_is_imported_afresh_each_time(tmp_path: Path) -> None:
    """Two copies of one package on PYTHONPATH: each script sees its own (as the overlay
    tests' shadowed packages need), `-m` runs with the working directory first on sys.path."""
    for version in ("1", "2"):
        pkg = tmp_path / version / "warmprobe"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"VERSION = {version!r}\n")
        (pkg / "__main__.py").write_text(
            "import json, sys, warmprobe\n"
            "print(json.dumps([warmprobe.VERSION, sys.argv[1:], sys.path[0]]))\n"
        )
    for version in ("1", "2", "1"):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / version)}
        plain, served = both(["-m", "warmprobe", "a"], env=env, cwd=tmp_path)
        assert json.loads(served.stdout) == json.loads(plain.stdout)
        assert json.loads(served.stdout) == [version, ["a"], str(tmp_path)]
    plain, served = both(["-c", "import sys; print(repr(sys.path[0]))"])
    assert plain.stdout == served.stdout == "''\n"  # -c: the empty string, as python -c has


def test_third_party_imports_are_preloaded_and_the_projects_are_not() -> None:
    names = ("yaml", "pairctl", "email.mime.text")
    code = f"import json, sys; print(json.dumps(sorted(m for m in {names!r} if m in sys.modules)))"
    plain, served = both(["-c", code])
    assert json.loads(plain.stdout) == []
    assert json.loads(served.stdout) == ["email.mime.text", "yaml"]


def test_threads_are_joined_and_atexit_handlers_run_before_the_exit() -> None:
    code = textwrap.dedent(
        """
        import atexit, threading, time
        atexit.register(lambda: print("atexit"))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
        print("main")
        """
    )
    plain, served = both(["-c", code])
    assert plain.stdout == served.stdout == "main\nthread\natexit\n"


def test_a_timeout_ends_the_script_and_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "child-alive"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c",
                          "import time; time.sleep(3); open({str(marker)!r}, 'w')"])
        time.sleep(30)
        """
    )
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run(sys.executable, ["-c", code], timeout=1, targets=TARGETS)
    assert time.monotonic() - start < 20
    time.sleep(4)
    assert not marker.exists()  # the script's child went with it
    assert warm.run(sys.executable, ["-c", "print(1)"], targets=TARGETS).stdout == "1\n"


def test_one_server_per_import_time_environment() -> None:
    def run(**env: str) -> None:
        full = {"PATH": "/usr/bin:/bin", **env}
        assert warm.run(sys.executable, ["-c", "pass"], env=full, targets=TARGETS).returncode == 0

    before = warm.servers()
    run(VLLM_LOGGING_LEVEL="ERROR")
    run(VLLM_LOGGING_LEVEL="INFO", DSV4_X="1")  # read lazily by vLLM and the plugin: shared
    assert warm.servers() == before + 1
    run(HF_HUB_OFFLINE="1")  # huggingface_hub reads it when imported: a server of its own
    assert warm.servers() == before + 2


def test_off_runs_plain_children(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(warm.OFF_ENV, "0")
    before = warm.servers()
    code = "import sys; print('email.mime.text' in sys.modules)"
    assert warm.run(sys.executable, ["-c", code], targets=TARGETS).stdout == "False\n"
    assert warm.servers() == before
