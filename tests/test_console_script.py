"""`dspark` works from an installed package, not only from a checkout.

The project is installed NON-editable (a built wheel's files, no path back to the clone)
into a throwaway venv; its dependencies come from this venv through a .pth line, so pip
needs no network. Every command then runs with the cwd outside the clone: what the code
needs of the clone (recipes/, .env) it must be told (--recipe, --env-file, $DSPARK_HOME),
and when it is not, the message says so. Takes ~10-20 s (one wheel build).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "dsv4-flash-dspark.yaml"
PACKAGES = ("pairctl", "sim", "bench", "perfmodel")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the project installed from a copy of the clone (the copy is removed
    after the install, so nothing can point back at it)."""
    tmp = tmp_path_factory.mktemp("console")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "results", "*.pyc")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=skip)
    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # This venv's packages (the deps, setuptools) after the new venv's own.
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps"]
    res = subprocess.run(
        [*pip, "--no-build-isolation", "--no-index", "--quiet", str(src)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    if res.returncode != 0 and "setuptools" in res.stderr and "No module" in res.stderr:
        pytest.skip(f"pip cannot build offline here: {res.stderr.strip()[-300:]}")
    assert res.returncode == 0, res.stderr
    shutil.rmtree(src)
    return env_dir


def dspark(venv: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DSPARK_HOME")}
    return subprocess.run(
        [str(venv / "bin" / "dspark"), *args],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    """.env.example with loopback addresses: a pair plan can render anywhere."""
    out = []
    for line in (REPO / ".env.example").read_text().splitlines():
        key = line.partition("=")[0].strip()
        out.append({"SPARK1": "SPARK1=127.0.0.1", "SPARK2": "SPARK2=127.0.0.2"}.get(key, line))
    p = tmp_path / "pair.env"
    p.write_text("\n".join(out) + "\n")
    return p


def test_the_installed_package_is_not_the_clone(venv: Path, tmp_path: Path) -> None:
    py = venv / "bin" / "python"
    res = subprocess.run(
        [str(py), "-c", "import pairctl; print(pairctl.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=True,
    )
    assert Path(res.stdout.strip()).is_relative_to(venv), res.stdout


def test_help_names_every_group(venv: Path, tmp_path: Path) -> None:
    p = dspark(venv, tmp_path, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Usage: dspark [up|down|status|")
    for word in ("Exit codes:", "bench NAME", "sim NAME", "fleet", "perfmodel", "gate"):
        assert word in p.stdout, word


def test_plan_renders_outside_the_clone(venv: Path, tmp_path: Path, env_file: Path) -> None:
    p = dspark(venv, tmp_path, "plan", "--env-file", str(env_file), "--recipe", str(RECIPE))
    assert p.returncode == 0, p.stderr
    runs = [x for x in p.stdout.splitlines() if x.startswith("docker run")]
    assert len(runs) == 2, p.stdout
    assert "127.0.0.1" in p.stdout and "127.0.0.2" in p.stdout


def test_without_the_project_files_the_message_says_what_to_do(
    venv: Path, tmp_path: Path, env_file: Path
) -> None:
    p = dspark(venv, tmp_path, "plan", "--env-file", str(env_file))
    assert p.returncode == 2
    assert "recipe" in p.stderr and "DSPARK_HOME" in p.stderr, p.stderr
    p = dspark(venv, tmp_path, "plan", "--env-file", str(env_file), DSPARK_HOME=str(REPO))
    assert p.returncode == 0 and p.stdout.count("docker run") == 2, p.stderr


def test_bench_help_comes_from_the_bench_module(venv: Path, tmp_path: Path) -> None:
    p = dspark(venv, tmp_path, "bench", "conc", "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: dspark bench conc")
    for flag in ("--concurrency", "--url", "--api-key", "--no-guard"):  # own and shared
        assert flag in p.stdout, flag
    p = dspark(venv, tmp_path, "bench", "nosuch")
    assert p.returncode == 2 and "invalid choice" in p.stderr
