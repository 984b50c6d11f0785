"""The tokenizer-cache overlay in a real vLLM API server (the CPU engine): active, and exact.

One real server (sim/engine/tiny_model.py `--spec headline`, prefix caching on) with
VLLM_INCREMENTAL_ENCODE_CACHE=1 and VLLM_INCREMENTAL_ENCODE_VERIFY_RATE=1, so every prompt the
cache encodes is also encoded the uncached way in the same process and compared (a mismatch is
logged and counted). A short conversation (a ~5k-token document, then 3 short turns) goes
through /v1/chat/completions with return_token_ids; then each turn's prompt ids go, as ids, to
/v1/completions, which skips the tokenizer: greedy outputs must be the same tokens. The
server's log must show the overlay active, cache hits in the API server, every cached encode
verified and no mismatch. bench.headline_real runs the full-size A/B (two servers, 100k tokens).
"""

from __future__ import annotations

import pytest
import requests

from bench.chat_ttft_ab import body_text
from bench.realserver import (
    Server,
    build_model,
    default_engine_venv,
    engine_env,
    serve_argv,
    wait_all,
)
from tests.support.real_engine import SERVER_BOOT_LIMIT_S

pytestmark = [pytest.mark.needs_engine]

PORT = 18291
MODEL = "tiny-dsv4"
TURNS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    venv = default_engine_venv()
    model = build_model(venv, "headline")
    log = tmp_path_factory.mktemp("headline_real") / "vllm_on.log"
    s = Server(
        "on",
        PORT,
        log,
        serve_argv(venv, model, PORT, MODEL),
        engine_env(
            True,
            {
                "VLLM_INCREMENTAL_ENCODE_VERIFY_RATE": "1",
                "VLLM_INCREMENTAL_ENCODE_LOG_INTERVAL_S": "0.001",
            },
        ),
    )
    s.start()
    try:
        wait_all([s], SERVER_BOOT_LIMIT_S, lambda _msg: None)  # 5x the idle boot
        yield s
    finally:
        s.stop()


def _chat(url: str, messages: list[dict[str, str]]) -> dict:
    r = requests.post(
        f"{url}/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": messages,
            "max_tokens": 8,
            "temperature": 0.0,
            "return_token_ids": True,
        },
        timeout=120,
    )
    r.raise_for_status()
    return r.json()


def _complete_ids(url: str, prompt_ids: list[int]) -> list[int]:
    r = requests.post(
        f"{url}/v1/completions",
        json={
            "model": MODEL,
            "prompt": prompt_ids,
            "max_tokens": 8,
            "temperature": 0.0,
            "return_token_ids": True,
        },
        timeout=120,
    )
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"]


def test_overlay_active_and_token_exact_in_the_real_api_server(server: Server) -> None:
    history = [{"role": "user", "content": body_text("trace", 5000, 7, 4.0) + "\n\nRead it."}]
    chats = []
    for turn in range(TURNS + 1):
        res = _chat(server.url, history)
        chats.append(res)
        reply = res["choices"][0]["message"]["content"] or "OK."
        question = body_text("trace", 200, 100 + turn, 4.0) + "\n\nWhat changes?"
        history += [{"role": "assistant", "content": reply}, {"role": "user", "content": question}]

    first = chats[0]["usage"]["prompt_tokens"]
    assert first >= 4000, first
    for res in chats:
        prompt_ids = res["prompt_token_ids"]
        assert len(prompt_ids) == res["usage"]["prompt_tokens"]
        # The same prompt as ids, past the tokenizer: the same greedy tokens.
        assert _complete_ids(server.url, prompt_ids) == res["choices"][0]["token_ids"]
    # Each turn re-sends the history: its prompt repeats the previous one but for the end,
    # where DSV4's encoder renders the last generation prompt (<think>) and the reply anew.
    for a, b in zip(chats, chats[1:], strict=False):
        pa, pb = a["prompt_token_ids"], b["prompt_token_ids"]
        common = next((i for i, (x, y) in enumerate(zip(pa, pb, strict=False)) if x != y), len(pa))
        assert common >= len(pa) - 8, (common, len(pa))

    assert server.overlay_active(), "no 'incremental-encode-cache active' line in the log"
    stats = server.encoder_stats()
    assert stats is not None, "the API server logged no incremental-encode counters"
    assert stats["hits"] >= TURNS, stats  # every later turn reused the history
    assert stats["reused_tokens"] >= TURNS * first, stats
    assert stats["verified"] == stats["calls"], stats  # verify rate 1: all checked
    assert stats["mismatches"] == 0, stats
