"""The HTTP routes of `kiln serve` (FastAPI on uvicorn): /v1/completions, /v1/chat/completions
(server-sent events or one JSON body), /v1/models, /health, /metrics.

FastAPI/Starlette was chosen over aiohttp after timing both streaming one token per SSE event from a
fake engine on CPU: the per-token cost of either is small beside a decode step, and Starlette's
streaming response cancels the stream when the client goes away, which is what frees a row at once.
Tokens come from the scheduler thread once per iteration (`deliver`, moved onto the event loop);
each request reads its own queue. A request that ends early (client gone, stop string) cancels its
job; the scheduler frees the row before its next step.
"""


import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kiln.serve.metrics import CONTENT_TYPE, ServeMetrics
from kiln.serve.protocol import ApiError, Params, Route, parse_body, parse_params
from kiln.serve.scheduler import Event, Job, QueueFull, Scheduler
from kiln.serve.texts import Served, TextStream

INSTALL_HINT = "pip install 'kiln[serve]'"
DISCONNECT_POLL_S = 0.5
"""How often a non-streaming request checks whether its client is still there."""


@dataclass
class State:
    served: Served
    scheduler: Scheduler
    metrics: ServeMetrics
    api_key: str | None
    queues: dict[Job, asyncio.Queue] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    draining: bool = False

    def deliver(self, events: list[Event]) -> None:
        """Called by the scheduler thread: hand the events to their requests on the event loop."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._dispatch, events)

    def _dispatch(self, events: list[Event]) -> None:
        for e in events:
            queue = self.queues.get(e.job)
            if queue is not None:
                queue.put_nowait(e)


def _usage(job: Job) -> dict[str, int]:
    return {"prompt_tokens": len(job.prompt), "completion_tokens": job.generated,
            "total_tokens": len(job.prompt) + job.generated}


def _choice(params: Params, text: str, finish: str | None, final: bool) -> dict[str, Any]:
    if params.route == "completions":
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if final:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}


async def _events(state: State, job: Job, params: Params, request) -> AsyncIterator[tuple[str, str | None]]:
    """(new text, finish reason or None) as the job's tokens come; cancels the job when left early."""
    queue: asyncio.Queue = asyncio.Queue()
    state.queues[job] = queue
    stream = TextStream(state.served.tokenizer, params.stop)
    done = False  # the scheduler has finished the job (else it is cancelled on the way out)
    try:
        state.scheduler.submit(job)
        while True:
            if request is None:  # streamed: Starlette cancels this generator when the client goes
                event = await queue.get()
            else:
                try:
                    event = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
            if event.error is not None:
                raise ApiError(500, event.error, type="server_error", code="engine_failed")
            text = stream.push(event.token, event.finish is not None)
            if state.served.tokenizer is None:
                text = f"{event.token}," if event.finish is None else str(event.token)
            finish = "stop" if stream.stopped else event.finish
            done = event.finish is not None
            yield text, finish
            if finish is not None:
                return
    except QueueFull:
        raise ApiError(429, f"the server is full ({state.scheduler.rows.rows} running, {state.scheduler.max_queue} "
                       "queued at most: --max-batch, --max-queue); retry later", type="rate_limit_error",
                       code="queue_full") from None
    finally:
        state.queues.pop(job, None)
        if not done:
            job.cancel()
            state.scheduler.wake()


def build_app(state: State) -> Any:
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, Response, StreamingResponse
        from starlette.exceptions import HTTPException
    except ImportError:
        raise ImportError(f"kiln serve needs fastapi and uvicorn: {INSTALL_HINT}") from None

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        state.loop = asyncio.get_running_loop()
        yield
        state.draining = True

    app = FastAPI(title="kiln serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def error(exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(ApiError)
    async def api_error(_request, exc: ApiError):
        return error(exc)

    @app.exception_handler(HTTPException)
    async def http_error(_request, exc: HTTPException):
        code = "not_found" if exc.status_code == 404 else None
        return error(ApiError(exc.status_code, str(exc.detail), code=code))

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if state.api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if given != f"Bearer {state.api_key}":
                what = "no API key given" if not given else "incorrect API key"
                return error(ApiError(401, f"{what}: send 'Authorization: Bearer KEY' (--api-key / KILN_API_KEY)",
                                      code="invalid_api_key"))
        return await call_next(request)

    @app.get("/health")
    async def health():
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        queued, running = state.scheduler.load
        return {"status": "ok", "running": running, "queued": queued, "warmup_s": state.metrics.warmup_s}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.text(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.served.name, "object": "model", "created": 0,
                                            "owned_by": "kiln", "max_model_len": state.served.context}]}

    async def complete(request: Request, route: Route):
        if state.draining:
            raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
        params = parse_params(parse_body(await request.body()), route)
        job = state.served.job(params)
        rid = ("cmpl-" if route == "completions" else "chatcmpl-") + uuid.uuid4().hex
        kind = "text_completion" if route == "completions" else "chat.completion"
        head = {"id": rid, "created": int(time.time()), "model": state.served.name}
        events = _events(state, job, params, None if params.stream else request)
        if not params.stream:
            parts, finish = [], None
            async for text, last in events:
                parts.append(text)
                finish = last
            return {**head, "object": kind, "choices": [_choice(params, "".join(parts), finish, True)],
                    "usage": _usage(job)}
        first = await anext(events, None)  # a 429 or a failure before the first token is a plain error

        async def sse():
            chunk_kind = kind if route == "completions" else "chat.completion.chunk"
            token_event = TokenEvent({**head, "object": chunk_kind}, route)
            try:
                if route == "chat":
                    delta = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    yield _sse({**head, "object": chunk_kind, "choices": [delta]})
                pending = [first] if first is not None else []
                async for item in _chain(pending, events):
                    text, finish = item
                    yield token_event(text) if finish is None and (text or route == "completions") else \
                        _sse({**head, "object": chunk_kind, "choices": [_choice(params, text, finish, False)]})
                if params.include_usage:
                    yield _sse({**head, "object": chunk_kind, "choices": [], "usage": _usage(job)})
                yield "data: [DONE]\n\n"
            except ApiError as exc:
                yield _sse(exc.body())
            finally:
                await events.aclose()

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await complete(request, "chat")

    return app


async def _chain(first: list, rest: AsyncIterator) -> AsyncIterator:
    for item in first:
        yield item
    async for item in rest:
        yield item


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class TokenEvent:
    """The server-sent event of one token's text mid-stream (no finish reason yet), byte for byte
    what `_sse` writes for it: the request's envelope is rendered once, and per token only the
    text is JSON-encoded (at many streams this runs once per stream per decode step)."""

    def __init__(self, head: dict[str, Any], route: Route):
        mark = "\x00text\x00"
        if route == "completions":
            choice = {"index": 0, "text": mark, "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "delta": {"content": mark}, "finish_reason": None}
        self.before, self.after = _sse({**head, "choices": [choice]}).split(json.dumps(mark))

    def __call__(self, text: str) -> str:
        return self.before + json.dumps(text, ensure_ascii=False) + self.after
