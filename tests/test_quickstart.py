"""README's real-hardware Quickstart, walked on the rehearsal's two test hosts (netns, real
sshd, the process runtime, the simulator): from two "fresh" hosts, where only rank 0 has
the image (a stand-in for `image ship --build`'s build) and neither has the model, through
`plan`, `image ship`, `model fetch` (a stand-in Hugging Face CLI on rank 0, since the
hosts reach no hub), `sync-overlays`, `preflight` and `up`, to a chat with the recipe's
served model name. The image and the checkpoint really travel to rank 1's own disk over
ssh, and preflight then finds the same image ID and the same model commit on both.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.rehearsal import chat, hosts, pairenv
from tests.support.rehearsal import pair_fixture, run_launcher
from tests.support.shards import shard_bytes

pytestmark = pytest.mark.needs_netns

REPO = Path(__file__).resolve().parents[1]
REV = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
SERVED = "deepseek-v4-flash-dspark"  # recipes/dsv4-flash-dspark.yaml served-model-name
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")

pair = pair_fixture("dsv4q", with_env=False)

# A stand-in for `hf download REPO --revision REV --local-dir DIR`: copies the prepared
# files and writes the metadata huggingface_hub leaves in a --local-dir download.
FAKE_HF = """#!{py}
import os, shutil, sys
from pathlib import Path
argv = sys.argv[1:]
assert argv[:2] == ["download", "deepseek-ai/DeepSeek-V4-Flash-DSpark"], argv
assert os.environ.get("HF_TOKEN") == {token!r}, "HF_TOKEN did not reach the downloader"
dest = Path(argv[argv.index("--local-dir") + 1])
rev = argv[argv.index("--revision") + 1]
shutil.copytree({hub!r}, dest, dirs_exist_ok=True)
meta = dest / ".cache" / "huggingface" / "download"
meta.mkdir(parents=True, exist_ok=True)
(meta / "config.json.metadata").write_text(rev + "\\nfake-etag\\n1700000000.0\\n")
"""


@pytest.fixture(scope="module")
def fresh_pair(pair: hosts.Pair) -> Iterator[tuple[hosts.Pair, Path, Path]]:
    """Two hosts as a day-one pair has them, the env file, and the stand-in `hf`."""
    lay = pairenv.layout(pair)
    for host in pair.hosts:
        pairenv.make_rdma_dir(host, lay)
        host.on_disk(lay.tilelang_dir).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(host.on_disk(lay.model_path), ignore_errors=True)
    pairenv.load_image(pair.h1)  # what `image ship --build` builds; rank 1 has nothing
    hub = pair.base / "client" / "hub-files"
    shutil.rmtree(hub, ignore_errors=True)
    hub.mkdir(parents=True)
    (hub / "config.json").write_text(json.dumps(pairenv.MODEL_CONFIG, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(pairenv.tokenizer_dir() / name, hub / name)
    for i, name in enumerate(SHARDS):  # real safetensors: model verify reads their headers
        (hub / name).write_bytes(shard_bytes((1 << 20) + i, fill=i))
    weight_map = {"a.weight": SHARDS[0], "b.weight": SHARDS[1]}
    (hub / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    hf = pair.base / "client" / "fake-hf"
    hf.write_text(FAKE_HF.format(py=sys.executable, token=pairenv.FAKE_HF_TOKEN, hub=str(hub)))
    hf.chmod(hf.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    values = pairenv.env_values(pair, lay)
    values.update(MODEL_REVISION=REV, CONTAINER_USER=f"{os.getuid()}:{os.getgid()}")
    env_file = pairenv.write_env(pair.base / "client" / "quickstart.env", values)
    yield pair, env_file, hf
    run_launcher(pair, REPO, "down", env_file=env_file, timeout=120)


def launch(pair: hosts.Pair, env_file: Path, *args: str, timeout: float = 240) -> tuple[int, str]:
    res = run_launcher(pair, REPO, *args, env_file=env_file, timeout=timeout)
    out = res.stdout + res.stderr
    assert pairenv.FAKE_HF_TOKEN not in out, "the launcher printed HF_TOKEN"
    return res.returncode, out


def test_quickstart_from_two_fresh_hosts_to_a_served_chat(
    fresh_pair: tuple[hosts.Pair, Path, Path],
) -> None:
    pair, env_file, hf = fresh_pair
    lay = pairenv.layout(pair)
    # step 2: the settings
    rc, out = launch(pair, env_file, "plan")
    assert rc == 0, out
    assert f"--served-model-name {SERVED}" in out and "--user" in out
    # step 3: the image onto rank 1, over ssh, through rank 1's own disk
    stage = pair.h1.node_view / "image-stage"
    assert pair.h2.docker("image", "inspect", pairenv.IMAGE).returncode != 0
    rc, out = launch(pair, env_file, "image", "ship", "--stage", str(stage))
    assert rc == 0, out
    assert f"{pairenv.IMAGE} = {pairenv.IMAGE_ID} on both ranks" in out
    got = pair.h2.docker("image", "inspect", "--format", "{{.Id}}", pairenv.IMAGE)
    assert got.stdout.strip() == pairenv.IMAGE_ID
    rc, out = launch(pair, env_file, "image", "ship", "--stage", str(stage))
    assert rc == 0 and "nothing to ship" in out, out
    # step 4: the checkpoint, downloaded on rank 0 and copied to rank 1's disk
    rc, out = launch(pair, env_file, "model", "fetch", "--downloader", str(hf), timeout=300)
    assert rc == 0, out
    assert "identical on both ranks" in out and "all 2 shards" in out
    for name in SHARDS:
        a = pair.h1.on_disk(lay.model_path) / name
        b = pair.h2.on_disk(lay.model_path) / name
        assert a.read_bytes() == b.read_bytes() and a != b
    rc, out = launch(pair, env_file, "model", "verify", "--checksum")
    assert rc == 0, out
    # step 5: the overlays
    rc, out = launch(pair, env_file, "sync-overlays")
    assert rc == 0, out
    # step 6: preflight finds the same image and the pinned commit on both nodes
    rc, out = launch(pair, env_file, "preflight")
    assert rc == 0, out
    assert any("PF-MODEL-REVISION" in ln and "PASS" in ln for ln in out.splitlines()), out
    assert not any("PF-IMAGE-MATCH" in ln and "FAIL" in ln for ln in out.splitlines()), out
    # step 7 and 8: up, then a chat with the served name
    rc, out = launch(pair, env_file, "up", "--timeout", "180", timeout=300)
    assert rc == 0, out
    base = f"http://{pair.h1.ip}:8000"
    assert chat.first_model(base) == SERVED
    reply = chat.stream_chat(base, "Say hello.", max_tokens=16)
    assert reply.simulator and reply.usage.get("completion_tokens", 0) > 0
    rc, out = launch(pair, env_file, "down")
    assert rc == 0, out
