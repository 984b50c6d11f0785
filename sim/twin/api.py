"""The HTTP surface: vLLM's OpenAI endpoints our tools use, plus /twin/* ground truth.

Stdlib ThreadingHTTPServer: one thread per connection, so each SSE stream simply blocks on
its request's event queue, which the engine thread fills after every step.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sim.twin import HEADER, OWNED_BY, PAIR_HEADER
from sim.twin.engine import Engine, Request
from sim.twin.metrics import Metrics
from sim.twin.requests_in import BadRequest, Builder

log = logging.getLogger("twin")


class TwinServer(ThreadingHTTPServer):
    """Holds the shared state the handlers need."""

    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(
        self,
        addr: tuple[str, int],
        engine: Engine,
        builder: Builder,
        metrics: Metrics,
        model_names: list[str],
        truth: dict[str, Any],
        pair_id: str | None = None,
    ) -> None:
        super().__init__(addr, Handler)
        self.pair_id = pair_id
        self.engine, self.builder, self.metrics = engine, builder, metrics
        self.model_names, self.truth = model_names, truth
        self.created = int(time.time())


def _error(message: str, code: int, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Handler(BaseHTTPRequestHandler):
    """Routes one HTTP request; HTTP/1.1 keep-alive, chunked SSE."""

    protocol_version = "HTTP/1.1"
    server: TwinServer
    server_version = "spark-twin"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet access log
        log.debug("%s %s", self.address_string(), fmt % args)

    # -- plumbing ------------------------------------------------------------------------
    def _identity(self) -> None:
        """The simulator label, and which simulated pair answered (when it knows)."""
        self.send_header(*HEADER)
        if self.server.pair_id:
            self.send_header(PAIR_HEADER, self.server.pair_id)

    def _send(
        self,
        code: int,
        body: bytes,
        ctype: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self._identity()
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(code, json.dumps(obj).encode(), headers=headers)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise BadRequest(f"body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))

    def _sse(self, obj: Any) -> None:
        self._chunk(
            b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        )

    # -- routes --------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        path = self.path.split("?", 1)[0]
        srv = self.server
        if path in ("/health", "/ping"):
            if srv.engine.dead:
                self._send(503, b"", "text/plain")
            else:
                self._send(200, b"", "text/plain")
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": name,
                            "object": "model",
                            "created": srv.created,
                            "owned_by": OWNED_BY,
                            "root": srv.model_names[0],
                            "parent": None,
                            "max_model_len": srv.builder.max_model_len,
                        }
                        for name in srv.model_names
                    ],
                },
            )
        elif path == "/metrics":
            self._send(200, srv.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/twin/truth":
            self._json(200, srv.truth)
        elif path == "/twin/requests":
            self._json(200, srv.engine.list_records())
        elif path == "/version":
            self._json(200, {"version": "0.33.0+spark-twin-simulator"})
        else:
            self._json(404, _error(f"no route {path}", 404, "NotFoundError"))

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        received_ns = time.monotonic_ns()
        path = self.path.split("?", 1)[0]
        try:
            body = self._body()
            if path == "/v1/chat/completions":
                self._generate(body, True, received_ns)
            elif path == "/v1/completions":
                self._generate(body, False, received_ns)
            elif path == "/tokenize":
                self._tokenize(body)
            elif path == "/twin/foreign":
                self._foreign(body)
            else:
                self._json(404, _error(f"no route {path}", 404, "NotFoundError"))
        except BadRequest as exc:
            self._json(400, _error(str(exc), 400, "BadRequestError"))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 - answer 500 rather than drop the connection
            log.exception("error serving %s", path)
            self.close_connection = True
            try:
                self._json(500, _error(f"{type(exc).__name__}: {exc}", 500, "InternalServerError"))
            except OSError:
                pass

    def _check_model(self, body: dict[str, Any]) -> str:
        names = self.server.model_names
        model = body.get("model") or names[0]
        if model not in names:
            raise _NotFound(model)
        return model

    def _tokenize(self, body: dict[str, Any]) -> None:
        b = self.server.builder
        if "messages" in body:
            ids = b.prompt_ids(body, chat=True)
        elif isinstance(body.get("prompt"), str):
            add = body.get("add_special_tokens", True)
            ids = b.encoder.tokenizer.encode(body["prompt"], add_special_tokens=bool(add)).ids
        else:
            raise BadRequest("tokenize needs `prompt` (string) or `messages`")
        self._json(
            200,
            {
                "count": len(ids),
                "max_model_len": b.max_model_len,
                "tokens": ids,
                "token_strs": None,
            },
        )

    def _foreign(self, body: dict[str, Any]) -> None:
        try:
            n, secs = int(body.get("requests", 1)), float(body.get("seconds", 10))
        except (TypeError, ValueError):
            raise BadRequest("foreign needs integer `requests` and number `seconds`") from None
        ids = []
        for i in range(max(n, 0)):
            req = self.server.builder.foreign(secs, i)
            self.server.engine.submit(req)
            ids.append(req.id)
        log.warning("Foreign traffic: %d phantom requests for %.1f s", n, secs)
        self._json(200, {"ids": ids, "requests": n, "seconds": secs})

    def _generate(self, body: dict[str, Any], chat: bool, received_ns: int) -> None:
        srv = self.server
        try:
            model = self._check_model(body)
        except _NotFound as exc:
            self._json(404, _error(f"The model `{exc}` does not exist.", 404, "NotFoundError"))
            return
        if srv.engine.dead:
            self._json(
                500, _error(f"EngineDeadError: {srv.engine.dead}", 500, "InternalServerError")
            )
            return
        # vLLM takes a client's X-Request-Id as the request id and prefixes it
        # (vllm/entrypoints/serve/engine/serving.py `_base_request_id`).
        prefix = "chatcmpl" if chat else "cmpl"
        given = self.headers.get("X-Request-Id")
        rid = f"{prefix}-{given}" if given else srv.engine.next_id(prefix)
        req = srv.builder.build(body, chat, received_ns, rid)
        srv.engine.submit(req)
        shape = _Shape(rid, model, chat, int(time.time()))
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            self._stream(req, shape, bool(opts.get("include_usage")))
        else:
            self._collect(req, shape)

    def _events(self, req: Request):
        while True:
            try:
                ev = req.events.get(timeout=1.0)
            except queue.Empty:
                if self.server.engine.dead:
                    yield ("error", f"engine dead: {self.server.engine.dead}")
                    return
                continue
            yield ev
            if ev[0] in ("finish", "error"):
                return

    def _collect(self, req: Request, shape: _Shape) -> None:
        text, reason = [], None
        for ev in self._events(req):
            if ev[0] == "tokens":
                text.append(ev[1])
            elif ev[0] == "finish":
                reason = ev[1]
            else:
                self._json(500, _error(ev[1], 500, "InternalServerError"))
                return
        self._json(
            200, shape.full("".join(text), reason, _usage(req)), headers={"X-Request-Id": req.id}
        )

    def _stream(self, req: Request, shape: _Shape, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Request-Id", req.id)
        self._identity()
        self.end_headers()
        try:
            if shape.chat:
                self._sse(shape.chunk({"role": "assistant", "content": ""}, None))
            for ev in self._events(req):
                if ev[0] == "tokens":
                    if ev[1] or not shape.chat:
                        self._sse(shape.chunk(ev[1], None))
                elif ev[0] == "finish":
                    self._sse(shape.chunk("" if not shape.chat else {"content": ""}, ev[1]))
                else:
                    self._sse(_error(ev[1], 500, "InternalServerError"))
                    break
            if include_usage:
                self._sse(shape.usage_chunk(_usage(req)))
            self._sse(b"[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            srv = self.server
            srv.engine.cancel(req)
            self.close_connection = True


class _NotFound(Exception):
    pass


def _usage(req: Request) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_len,
        "total_tokens": req.prompt_len + req.generated,
        "completion_tokens": req.generated,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


class _Shape:
    """vLLM's OpenAI response shapes for chat and text completions."""

    def __init__(self, rid: str, model: str, chat: bool, created: int) -> None:
        self.rid, self.model, self.chat, self.created = rid, model, chat, created

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, delta: Any, finish: str | None) -> dict[str, Any]:
        if self.chat:
            if isinstance(delta, str):
                delta = {"content": delta}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {
            "index": 0,
            "text": delta,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}

    def full(self, text: str, finish: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "reasoning_content": None,
                    "tool_calls": [],
                },
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage}
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        return {**self._head("text_completion"), "choices": [choice], "usage": usage}
