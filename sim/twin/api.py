"""The HTTP surface: vLLM's OpenAI endpoints our tools use, plus /twin/* ground truth.

Stdlib ThreadingHTTPServer: one thread per connection, so each SSE stream simply blocks on
its request's event queue, which the engine thread fills after every step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sim.twin import HEADER, OWNED_BY, PAIR_HEADER, auth, params, shapes, streaming, thinking
from sim.twin.engine import Engine
from sim.twin.errors import NOT_FOUND, error, json_invalid, permission, sanitized
from sim.twin.generation import Generation, merge_logprobs
from sim.twin.injector import ForeignSpec, Injector
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
        api_keys: list[str] | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        super().__init__(addr, Handler, bind_and_activate=sock is None)
        if sock is not None:  # bound before the boot (sim/twin/serve.py bind_port): listen now
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()
            self.server_activate()
        self.pair_id = pair_id
        self.engine, self.builder, self.metrics = engine, builder, metrics
        self.model_names, self.truth = model_names, truth
        self.created = int(time.time())
        serve_args = truth.get("serve_args") or {}
        # --per-request-spec-decode-metrics (vllm/config/observability.py): none|summary|detailed
        self.spec_metrics = str(serve_args.get("per_request_spec_decode_metrics") or "none")
        self.injector = Injector(self.fire_foreign)
        self.open_streams = 0  # SSE responses being written (peer-loss shutdown timing)
        self.prompt_details = bool(serve_args.get("enable_prompt_tokens_details"))
        # --reasoning-parser deepseek_v4: chat replies split into reasoning and content
        self.splits = serve_args.get("reasoning_parser") in thinking.MODELLED_PARSERS
        tp = int(serve_args.get("tensor_parallel_size") or 1)
        # The hash stands for vllm_config.compute_hash(): what is served, not how it is named.
        hashed = {k: v for k, v in serve_args.items() if not k.startswith("fingerprint_")}
        digest = hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode())
        self.fingerprint = shapes.fingerprint(
            tp,
            digest.hexdigest(),
            str(serve_args.get("fingerprint_mode") or "full"),
            serve_args.get("fingerprint_value"),
        )
        self.tokens = auth.tokens(api_keys)

    def fire_foreign(self, spec: ForeignSpec) -> list[str]:
        """Submit spec.requests phantom requests to the engine now; their ids."""
        ids = []
        for i in range(max(spec.requests, 0)):
            req = self.builder.foreign(spec.seconds, i, spec.tokens, spec.prompt_tokens)
            self.engine.submit(req)
            ids.append(req.id)
        return ids


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
        ctype: str | None = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        if ctype:
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
        except json.JSONDecodeError as exc:
            raise json_invalid(exc) from exc
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

    def _authorized(self, method: str, path: str) -> bool:
        """vLLM's API-key middleware (sim/twin/auth.py); answers 401 itself on a miss."""
        if auth.allowed(method, path, self.headers.get("Authorization"), self.server.tokens):
            return True
        self.close_connection = True  # the unread request body must not become a request
        self._json(401, auth.UNAUTHORIZED)
        return False

    # -- routes --------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        path = self.path.split("?", 1)[0]
        srv = self.server
        if not self._authorized("GET", path):
            return
        if path in ("/health", "/ping"):
            # vLLM's /health is an empty Response (no content type), 503 once the engine
            # is dead (vllm/entrypoints/serve/instrumentator/health.py)
            self._send(503 if srv.engine.dead else 200, b"", None)
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
                            "permission": [permission(srv.created)],
                        }
                        for name in srv.model_names
                    ],
                },
            )
        elif path == "/metrics":
            self._send(200, srv.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            srv.injector.notify("scrape")
        elif path == "/twin/truth":
            self._json(200, srv.truth)
        elif path == "/twin/requests":
            self._json(200, srv.engine.list_records())
        elif path == "/version":
            self._json(200, {"version": "0.33.0+spark-twin-simulator"})
        else:
            self._json(404, NOT_FOUND)

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        received_ns = time.monotonic_ns()
        path = self.path.split("?", 1)[0]
        if not self._authorized("POST", path):
            return
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
                self._json(404, NOT_FOUND)
        except BadRequest as exc:
            self._json(400, error(str(exc), 400, exc.kind, exc.param))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 - answer 500 rather than drop the connection
            log.exception("error serving %s", path)
            self.close_connection = True
            try:
                self._json(500, error(f"{type(exc).__name__}: {exc}", 500, "InternalServerError"))
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
        """Phantom requests now, or armed: `after` an event, `nth` time, `offset_ms` later."""
        try:
            tokens = body.get("tokens")
            spec = ForeignSpec(
                requests=int(body.get("requests", 1)),
                seconds=float(body.get("seconds", 10)),
                tokens=None if tokens is None else int(tokens),
                prompt_tokens=int(body.get("prompt_tokens", 64)),
            )
            after = body.get("after")
            nth, offset_s = int(body.get("nth", 1)), float(body.get("offset_ms", 0)) / 1000
        except (TypeError, ValueError):
            raise BadRequest(
                "foreign takes integers `requests`, `tokens`, `prompt_tokens`, `nth` and numbers "
                "`seconds`, `offset_ms`"
            ) from None
        if after is not None:
            try:
                self.server.injector.arm(str(after), nth, offset_s, spec)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            self._json(200, {"armed": True, "after": after, "nth": nth, **vars(spec)})
            return
        ids = self.server.fire_foreign(spec)
        log.warning("Foreign traffic: %d phantom requests for %.1f s", spec.requests, spec.seconds)
        self._json(200, {"ids": ids, **vars(spec)})

    def _generate(self, body: dict[str, Any], chat: bool, received_ns: int) -> None:
        srv = self.server
        srv.injector.notify("request")
        try:
            model = self._check_model(body)
        except _NotFound as exc:
            # vllm/entrypoints/serve/engine/serving.py _check_model (0.32 and 0.33)
            aliases = ", ".join(self.server.model_names)
            msg = f"The model `{exc}` does not exist. Valid aliases: {aliases}."
            self._json(404, error(sanitized(msg), 404, "NotFoundError", "model"))
            return
        if srv.engine.dead:
            self._json(
                500, error(f"EngineDeadError: {srv.engine.dead}", 500, "InternalServerError")
            )
            return
        p = params.parse(body, chat)
        prompt = srv.builder.render(body, chat, model)
        # vLLM takes a client's X-Request-Id as the request id and prefixes it
        # (vllm/entrypoints/serve/engine/serving.py `_base_request_id`).
        prefix = "chatcmpl" if chat else "cmpl"
        given = self.headers.get("X-Request-Id")
        rid = f"{prefix}-{given}" if given else srv.engine.next_id(prefix)
        # n > 1: one engine request per choice (vLLM's ParentRequest children, ids "i_rid").
        ids = [rid] if p.n == 1 else [f"{i}_{rid}" for i in range(p.n)]
        reqs = [srv.builder.build(prompt, p, received_ns, cid, i) for i, cid in enumerate(ids)]
        shape = shapes.Shape(rid, model, chat, int(time.time()), srv.fingerprint)
        parser = None
        if chat and srv.splits:  # the parser's start state (sim/twin/thinking.py)
            parser = thinking.parser_thinking(thinking.template_kwargs(body))
        gen = Generation(
            reqs,
            p,
            shape,
            srv.engine,
            srv.injector,
            srv.spec_metrics,
            srv.prompt_details,
            parser,
            body.get("include_reasoning") is not False,
        )
        for r in reqs:
            srv.engine.submit(r)
        if p.stream:
            self._stream(gen)
        else:
            self._collect(gen)

    def _collect(self, gen: Generation) -> None:
        n = len(gen.reqs)
        pieces: list[list[str]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        lps: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        for i, ev in gen.events():
            if ev[0] == "tokens":
                pieces[i] += gen.pieces(ev)
                if gen.p.logprobs is not None:
                    lps[i].append(gen.logprobs(i, ev))
            elif ev[0] == "finish":
                reasons[i] = ev[1]
            else:
                self._json(500, error(ev[1], 500, "InternalServerError"))
                return
        choices = []
        for i in range(n):
            reasoning, content = gen.whole(i, pieces[i])
            lp = None if gen.hide_logprobs else merge_logprobs(lps[i], gen.shape.chat)
            choices.append((content, reasons[i], lp, reasoning))
        body = gen.shape.full(choices, gen.usage(full=True), gen.metrics())
        self._json(200, body, headers={"X-Request-Id": gen.rid})

    def _stream(self, gen: Generation) -> None:
        shape = gen.shape
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Request-Id", gen.rid)
        self._identity()
        self.end_headers()
        self.server.open_streams += 1
        try:
            if shape.chat:
                for i in range(len(gen.reqs)):
                    self._sse(gen.with_usage(shape.first_chat_chunk(i)))
            events = streaming.split if gen.splits is not None else streaming.plain
            events(gen, self._sse, lambda: self.server.engine.peer_lost is not None)
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            for r in gen.reqs:
                self.server.engine.cancel(r)
            self.close_connection = True
        finally:
            self.server.open_streams -= 1


class _NotFound(Exception):
    pass
