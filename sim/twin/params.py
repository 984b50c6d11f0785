"""OpenAI request fields -> the sampling parameters the twin uses, checked as vLLM 0.33 checks them.

vLLM validates a request in three layers, and the twin answers each one's failures with the
body that layer returns:

1. pydantic field types (vllm/entrypoints/openai/chat_completion/protocol.py,
   completion/protocol.py) -> HTTP 400, `type` "Bad Request", the message built by
   vllm/entrypoints/serve/exception_handling/handlers/validation.py
   ("1 validation error:\\n  {...}") and `param` the field's dotted location ("body.n");
2. the request models' `mode="before"` validators (stream_options without stream, top_logprobs
   without logprobs, ...) and 3. SamplingParams._verify_args (vllm/sampling_params.py: n,
   max_tokens, min_tokens, temperature, stop, logprobs) -> VLLMValidationError, answered by
   vllm/entrypoints/serve/exception_handling/error_response.py as `type` "BadRequestError",
   `param` the parameter, and the message "<text> (parameter=P, value=V)"
   (VLLMValidationError.__str__ in vllm/exceptions.py).

Only text generation is modelled: fields the twin has no use for (tools, response_format,
penalties, ...) are accepted and ignored, as vLLM ignores fields it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_LOGPROBS = 20  # vLLM's --max-logprobs default (vllm/config/model.py)
MAX_N = 16384  # VLLM_MAX_N_SEQUENCES default (vllm/envs.py)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens default


class BadRequest(ValueError):
    """HTTP 400 with vLLM's error body: `kind` is its `type`, `param` its `param`."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        value: Any = None,
        kind: str = "BadRequestError",
    ) -> None:
        extras = []
        if param is not None and kind == "BadRequestError":
            extras.append(f"parameter={param}")
        if value is not None and kind == "BadRequestError":
            extras.append(f"value={value}")
        super().__init__(f"{message} ({', '.join(extras)})" if extras else message)
        self.param, self.kind = param, kind


def _summary(value: Any) -> Any:
    """validation.py's _summarize_error_input: containers described, long strings cut."""
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "...[truncated]"
    if isinstance(value, list | tuple | set | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def type_error(field: str, kind: str, msg: str, value: Any) -> BadRequest:
    """One pydantic field error, rendered as vLLM's validation handler renders it."""
    loc = f"body.{field}"
    err = {"type": kind, "loc": loc, "msg": msg, "input": _summary(value)}
    return BadRequest(f"1 validation error:\n  {err}", param=loc, kind="Bad Request")


def _int(body: dict[str, Any], field: str, default: int | None) -> int | None:
    """Pydantic's lax int: ints, integral floats and numeric strings; bools are ints too."""
    v = body.get(field, default)
    if v is None:
        return None
    if isinstance(v, bool | int):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, float):
        raise type_error(
            field,
            "int_from_float",
            "Input should be a valid integer, got a number with a fractional part",
            v,
        )
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            raise type_error(
                field,
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
                v,
            ) from None
    raise type_error(field, "int_type", "Input should be a valid integer", v)


def _float(body: dict[str, Any], field: str) -> float | None:
    v = body.get(field)
    if v is None:
        return None
    if isinstance(v, bool | int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            raise type_error(
                field,
                "float_parsing",
                "Input should be a valid number, unable to parse string as a number",
                v,
            ) from None
    raise type_error(field, "float_type", "Input should be a valid number", v)


def _stop(body: dict[str, Any]) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise type_error("stop", "list_type", "Input should be a valid list", v)
    if any(not s for s in v):  # SamplingParams._verify_args
        raise BadRequest("stop cannot contain an empty string.")
    return list(v)


@dataclass(frozen=True)
class Params:
    """The sampling parameters of one request (one per choice when n > 1)."""

    n: int
    max_tokens: int | None  # None: as many as fit (chat); resolved against the prompt later
    min_tokens: int
    temperature: float
    seed: int | None
    stop: list[str]
    ignore_eos: bool
    logprobs: int | None  # top logprobs per token (0 = the sampled token's only); None = off
    stream: bool
    include_usage: bool
    continuous_usage: bool


def parse(body: dict[str, Any], chat: bool) -> Params:
    """Validate the request fields in vLLM's order; raise BadRequest as vLLM would answer."""
    stream = bool(body.get("stream"))
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise type_error("stream_options", "model_type", "Input should be a valid dictionary", opts)
    # Model validators (mode="before"): they run before the field checks below.
    if opts and not stream:
        raise BadRequest(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    logprobs = _logprobs(body, chat)
    n = _int(body, "n", 1)
    max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else None
    if chat:
        max_tokens = _int(body, max_field or "max_tokens", None)
    else:
        max_tokens = _int(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    min_tokens = _int(body, "min_tokens", 0) or 0
    seed = _int(body, "seed", None)
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise type_error("seed", "less_than_equal", "Input should be a valid int64", seed)
    temp = _float(body, "temperature")
    stop = _stop(body)
    # SamplingParams._verify_args, in its order.
    if n is None or n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise BadRequest(
            f"n must be at most {MAX_N}, got {n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable."
        )
    # SamplingParams' own default (a model's generation_config.json can change it in vLLM).
    temperature = 1.0 if temp is None else temp
    if temperature < 0.0:
        raise BadRequest(
            f"temperature must be non-negative, got {temperature}.", "temperature", temperature
        )
    if temperature > 2.0:
        raise BadRequest(f"temperature must be in [0, 2], got {temperature}.", "temperature", temp)
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest(
            f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
        )
    if min_tokens < 0:
        raise BadRequest(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if max_tokens is not None and min_tokens > max_tokens:
        raise BadRequest(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    if logprobs is not None and logprobs > MAX_LOGPROBS:
        raise BadRequest(
            f"Requested sample logprobs of {logprobs}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
            "logprobs",
            logprobs,
        )
    include_usage = bool(opts and opts.get("include_usage"))
    return Params(
        n=n,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=temperature,
        seed=seed,
        stop=stop,
        ignore_eos=bool(body.get("ignore_eos")),
        logprobs=logprobs,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(opts and opts.get("continuous_usage_stats")),
    )


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """Top logprobs per sampled token, or None; the check_logprobs validators' errors."""
    if chat:
        top = body.get("top_logprobs")
        if top is not None and not isinstance(top, int | float):
            raise BadRequest("`top_logprobs` must be an integer.", "top_logprobs", top)
        if top is not None and top < 0 and top != -1:
            raise BadRequest("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
        on = body.get("logprobs")
        if top is not None and (top == -1 or top > 0) and not on:
            raise BadRequest(
                "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
        if on is not None and not isinstance(on, bool):
            raise type_error("logprobs", "bool_type", "Input should be a valid boolean", on)
        return int(top or 0) if on else None
    lp = body.get("logprobs")
    if lp is not None and not isinstance(lp, int | float):
        raise BadRequest("`logprobs` must be an integer.", "logprobs", lp)
    if lp is not None and lp < 0 and lp != -1:
        raise BadRequest("`logprobs` must be a positive value or -1.", "logprobs", lp)
    return None if lp is None else int(lp)


# Content part types read as text (vllm/renderers/chat_utils/chat_message.py TEXT_PART_TYPES,
# each parser's text key) and the media types a text-only model cannot take.
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
TEXT_PARTS |= {"thinking": "thinking"}
MEDIA_PARTS = (
    "image_url",
    "input_image",
    "image_embeds",
    "image_pil",
    "audio_url",
    "input_audio",
    "audio_embeds",
    "video_url",
    "video_embeds",
    "prompt_embeds",
)


def _part_text(part: Any, model: str) -> str | None:
    """One content part -> its text (None: skipped, as vLLM skips a text part without text)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise type_error("messages", "model_type", "Input should be a valid dictionary", part)
    kind = part.get("type", "text")
    if kind in TEXT_PARTS:
        text = part.get(TEXT_PARTS[kind])
        return None if text is None else str(text)
    if kind in MEDIA_PARTS:
        # vllm/multimodal/registry.py create_processor, for a model with no multimodal processor.
        raise BadRequest(f"{model} is not a multimodal model")
    supported = sorted({*TEXT_PARTS, *MEDIA_PARTS, "tool_reference"})
    raise BadRequest(
        f"Unsupported chat content part type: {kind!r}. Supported types: {', '.join(supported)}.",
        "type",
        kind,
    )


def chat_messages(body: dict[str, Any], model: str) -> list[dict[str, Any]]:
    """`messages` with every content-part array flattened to the text the model sees.

    vLLM parses the parts (vllm/renderers/chat_utils/chat_message.py) and DeepSeek-V4's encoder
    joins the text blocks with a blank line (vllm/tokenizers/deepseek_v4_encoding.py
    flatten_content_blocks).
    """
    if "messages" not in body:
        raise type_error("messages", "missing", "Field required", body)
    msgs = body["messages"]
    if not isinstance(msgs, list):
        raise type_error("messages", "list_type", "Input should be a valid list", msgs)
    out = []
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise type_error(
                "messages", "model_type", "Input should be a message object with a role", m
            )
        content = m.get("content")
        if isinstance(content, list):
            texts = [t for t in (_part_text(p, model) for p in content) if t is not None]
            m = {**m, "content": "\n\n".join(texts)}
        elif content is not None and not isinstance(content, str):
            raise type_error("messages", "string_type", "Input should be a valid string", content)
        out.append(m)
    return out
