"""The bulk copies of a group of four: every headless rank at once, a failure named.

``model fetch`` and ``image ship`` send rank 0's bytes to ranks 1-3 in parallel
(pairctl.nodes.fanout). The copies here are stand-ins for the fabric send and the image
delivery (what they do on one node is tests/test_ship.py's); a barrier that only opens once
all three copies are in flight proves they run at once without timing anything.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pairctl.contracts import EXIT_OK, EXIT_RUNTIME
from pairctl.engine import imageship
from pairctl.nodes import fanout, modelfetch
from pairctl.nodes.transfer import TransferError
from pairctl.pair.config import parse_env
from pairctl.pair.recipe import load_recipe
from pairctl.pair.resolved import ResolvedPair, resolve
from tests.test_groups import QUAD

REPO = Path(__file__).resolve().parents[1]
RECIPE = load_recipe(REPO / "recipes" / "dsv4-flash-dspark.yaml")


def quad(tmp: Path) -> ResolvedPair:
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model-00001-of-00001.safetensors").write_bytes(b"x" * 64)
    return resolve(parse_env(dict(QUAD, MODEL_PATH=str(model), MODEL_REVISION="a" * 40)), RECIPE)


def test_model_copy_runs_on_every_rank_at_once_and_names_the_one_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    pair = quad(tmp_path)
    together = threading.Barrier(3, timeout=30)  # opens only with all three in flight
    sent: dict[int, str] = {}

    def send(node, addr, root, far, files, what):  # noqa: ANN001 - the fabric.send stand-in
        together.wait()
        if node.rank == 3:
            raise TransferError("model-00001-of-00001.safetensors: ssh: connection reset")
        sent[node.rank] = addr
        return len(files), 64

    verified: list[int] = []
    monkeypatch.setattr(modelfetch.fabric, "send", send)
    monkeypatch.setattr(modelfetch, "verify", lambda *a, **k: verified.append(1) or EXIT_OK)
    assert modelfetch.fetch(pair, skip_download=True) == EXIT_RUNTIME
    # ranks 1 and 2 got their copy, each over its own fabric address; nothing was verified
    assert sent == {1: "192.168.192.2", 2: "192.168.192.3"} and verified == []
    err = capsys.readouterr().err
    assert "copy to rank 3 (10.0.0.14) failed: model-00001" in err
    assert "the copy to rank 3 failed; run model fetch again to resume it" in err


def test_image_ship_saves_once_delivers_to_each_rank_and_keeps_the_tar_on_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    pair = quad(tmp_path)
    saves: list[Path] = []
    together = threading.Barrier(3, timeout=30)

    def save(node, image, tar):  # noqa: ANN001 - docker save's stand-in
        saves.append(tar)
        tar.write_bytes(b"tar")

    def deliver(sub, stage, remote_stage, dockerfile, save_tar, keep_tar):  # noqa: ANN001
        together.wait()
        assert (
            keep_tar
            and sub.nodes[0].rank == 0
            and sub.fabric2 == pair.fabric_addr(sub.nodes[1].rank)
        )
        save_tar(Path(stage) / "img.tar")
        return EXIT_RUNTIME if sub.nodes[1].rank == 2 else EXIT_OK

    monkeypatch.setattr(imageship, "save", save)
    monkeypatch.setattr(imageship, "deliver", deliver)
    assert imageship.ship(pair, stage=str(tmp_path)) == EXIT_RUNTIME
    assert saves == [tmp_path / "img.tar"]  # one docker save for three ranks
    assert (tmp_path / "img.tar").exists()  # kept: a re-run resumes from it
    assert "image ship failed on rank 2" in capsys.readouterr().err

    monkeypatch.setattr(imageship, "deliver", lambda *a: (together.wait(), EXIT_OK)[1])
    together.reset()
    assert imageship.ship(pair, stage=str(tmp_path)) == EXIT_OK
    assert "on all 4 ranks" in capsys.readouterr().out


def test_fanout_reports_an_exception_as_that_ranks_failure() -> None:
    said: list[str] = []

    def job(rank: int) -> int:
        if rank == 2:
            raise OSError("no route to host")
        return EXIT_OK

    got = fanout.each_rank([1, 2, 3], job, said.append)
    assert got == {1: EXIT_OK, 2: EXIT_RUNTIME, 3: EXIT_OK}
    assert said == ["rank 2: OSError: no route to host"]
    assert fanout.summary(got) == (EXIT_RUNTIME, "rank 2")
