"""The twin prints vLLM 0.33's own log lines: same wording, same file and line, same format
and process names, in boot order; every line of a booted and stopped twin is one of them
(or the twin's own, marked SparkTwin)."""

from __future__ import annotations

import ast
import mmap
import re
import signal
from pathlib import Path

import pytest

from sim.twin import vllm_log
from tests.support.twin import Twin, free_port
from tests.support.vllm_src import site_packages, string_constants

LOG_CALLS = {"info", "warning", "error", "debug", "exception", "info_once", "warning_once"}


def _logger_call_lines(path: Path) -> set[int]:
    tree = ast.parse(path.read_text())
    return {
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in LOG_CALLS
    }


@pytest.mark.needs_vllm
@pytest.mark.parametrize(
    "line", [*vllm_log.LINES.values(), *vllm_log.UVICORN.values()], ids=lambda x: x.template[:40]
)
def test_each_line_is_the_installed_sources(line: vllm_log.Line) -> None:
    """The format string is in the file, and a logger call sits on the line the twin prints."""
    path = site_packages() / line.source
    assert path.is_file(), line.source
    assert line.template in string_constants(path), f"{line.template!r} not in {line.source}"
    assert line.lineno in _logger_call_lines(path), f"no logger call at {line.fileinfo}"


@pytest.mark.needs_vllm
def test_format_and_process_names_are_vllms() -> None:
    sp = site_packages()
    logger_src = (sp / "vllm/logger.py").read_text()
    assert (
        "(%(vllm_process_name)s " in logger_src and '"pid=%(process)d) %(levelname)s' in logger_src
    )
    assert '"[%(fileinfo)s:%(lineno)d] %(message)s"' in logger_src
    assert '_DATE_FORMAT = "%m-%d %H:%M:%S"' in logger_src
    assert (
        'decorate_logs("APIServer"'
        in (sp / "vllm/entrypoints/launchers/api_server/entry.py").read_text()
    )
    utils = (sp / "vllm/v1/engine/utils.py").read_text()
    assert 'if is_dp else "EngineCore"' in utils  # no _DP0 suffix without data parallel
    executor = (sp / "vllm/v1/executor/multiproc_executor.py").read_text()
    assert 'process_name = "Worker"' in executor and 'process_name += f"_TP{tp_rank}"' in executor
    assert "LOGGING_CONFIG" in (sp / "uvicorn/config.py").read_text()
    assert '"fmt": "%(levelprefix)s %(message)s"' in (sp / "uvicorn/config.py").read_text()


@pytest.mark.needs_vllm
def test_torch_store_messages_are_torchs() -> None:
    """The rendezvous errors' wording is in the installed libtorch (c10d TCPStore)."""
    lib = site_packages() / "torch/lib/libtorch_cpu.so"
    with open(lib, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for name, text in vllm_log.TORCH_STORE.items():
            assert mm.find(text.encode()) >= 0, name
        # gloo's words for a TP peer lost under a collective (sim/twin/peerloss.py)
        for text in (*vllm_log.GLOO_PEER_CLOSED, *vllm_log.GLOO_READ_ERROR):
            assert mm.find(text.encode()) >= 0, text


def _pattern(template: str) -> str:
    """A printf-style template as a regex for one rendered message."""
    out, i = [], 0
    for m in re.finditer(r"%(?:\.\d+)?[sdf]", template):
        out.append(re.escape(template[i : m.start()]))
        out.append(".*?")
        i = m.end()
    out.append(re.escape(template[i:]))
    return "".join(out)


VLLM_LINE = re.compile(
    r"^\((?P<proc>[A-Za-z_0-9]+) pid=\d+\) (?:INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d "
    r"\[(?P<file>[^\]]+)\] (?P<msg>.*)$"
)


def test_every_line_of_a_boot_and_stop_is_vllms_or_marked(tmp_path: Path) -> None:
    port = free_port()
    twin = Twin(
        ["dsv4", "--host", "127.0.0.1", "--port", str(port), "--twin-profile", "rehearsal"],
        tmp_path,
        "one",
    )
    try:
        twin.wait_log("Application startup complete.", timeout=20)
        twin.kill(signal.SIGTERM)
        assert twin.wait_exit(10) == 0
    finally:
        twin.stop()
    by_file = {}
    for line in vllm_log.LINES.values():
        by_file.setdefault(line.fileinfo, []).append(line)
    uvicorn = {
        f"{x.level}:{' ' * (8 - len(x.level))} {x.template}" for x in vllm_log.UVICORN.values()
    }
    seen_procs = set()
    for raw in twin.log().rstrip("\n").split("\n"):  # lines as `docker logs` cuts them
        bar = raw.strip("\r")
        if not bar or bar.startswith("Capturing CUDA graphs (FULL):"):  # tqdm's \r-bar
            continue
        if raw in uvicorn or re.fullmatch(r"INFO:     Started server process \[\d+\]", raw):
            continue
        m = VLLM_LINE.match(raw)
        assert m, f"not vLLM's format: {raw!r}"
        seen_procs.add(m["proc"])
        if m["proc"] == vllm_log.TWIN_PROCESS:
            assert m["file"] == "spark-twin", raw
            continue
        lines = by_file.get(m["file"], [])
        assert any(re.fullmatch(_pattern(x.template), m["msg"]) for x in lines), raw
    assert {"APIServer", "EngineCore", "Worker", "SparkTwin"} <= seen_procs
    assert "Worker_TP0" not in seen_procs  # TP = 1: vLLM adds _TP<rank> only when TP > 1


@pytest.mark.needs_vllm
def test_engine_dead_message_is_vllms() -> None:
    """What a request gets after a lost peer: EngineDeadError's own message."""
    path = site_packages() / "vllm/v1/engine/exceptions.py"
    assert vllm_log.ENGINE_DEAD in string_constants(path)
