"""The OpenAI request bodies `kiln serve` takes, checked field by field, and its error shape.

A bad request is answered 400 with `{"error": {"message", "type", "param", "code"}}` naming the
field (unknown fields too: a typo must not be silently ignored), as OpenAI's API does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

Route = Literal["completions", "chat"]

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "stream", "stream_options",
          "user"}
FIELDS: dict[Route, set[str]] = {"completions": COMMON | {"prompt"},
                                 "chat": COMMON | {"messages", "max_completion_tokens"}}
MAX_STOP_STRINGS = 16
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for /v1/completions (or the room left in the context, if less); chat defaults to
the room left."""


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Params:
    """A checked request: `prompt` (completions: text or token ids) or `messages` (chat)."""

    route: Route
    model: str | None
    prompt: str | list[int] | None
    messages: list[dict[str, str]] | None
    max_tokens: int | None
    """None: not given (kiln.serve.texts.Served.job picks the default)."""
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(None, f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object", "invalid_json")
    return body


def _number(body: dict, key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise bad(key, f"{key} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _int(body: dict, key: str, low: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        raise bad(key, f"{key} must be an integer{f' >= {low}' if low is not None else ''}, got {value!r}")
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items) \
            or len(items) > MAX_STOP_STRINGS:
        raise bad("stop", f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them, got {stop!r}")
    return tuple(items)


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise bad("prompt", "prompt must be a non-empty string or a list of token ids (one prompt per request)")


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # OpenAI's content parts: text ones only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad(f"messages[{i}].content", "only text content parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise bad(f"messages[{i}]", "each message needs a string role and string content")
        unknown = sorted(set(m) - {"role", "content", "name"})
        if unknown:
            raise bad(f"messages[{i}].{unknown[0]}", f"unknown field {unknown[0]!r} in messages[{i}]",
                      "unknown_field")
        out.append({**m, "content": content})
    return out


def parse_params(body: dict[str, Any], route: Route) -> Params:
    """`body` checked for `route`; ApiError (400) naming the first bad field."""
    unknown = sorted(set(body) - FIELDS[route])
    if unknown:
        raise bad(unknown[0], f"unknown or unsupported field {unknown[0]!r}; this server takes: "
                  f"{', '.join(sorted(FIELDS[route]))}", "unknown_field")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"model must be a string, got {model!r}")
    n = _int(body, "n", 1)
    if n not in (None, 1):
        raise bad("n", f"n must be 1 (one choice per request), got {n}")
    key = "max_completion_tokens" if route == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"stream must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad("stream_options", "stream_options takes only include_usage")
    top_k = _int(body, "top_k", -1)
    seed = _int(body, "seed")
    return Params(
        route=route, model=model,
        prompt=_prompt(body) if route == "completions" else None,
        messages=_messages(body) if route == "chat" else None,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=max(top_k or 0, 0),
        stop=_stop(body), seed=seed, stream=stream, include_usage=bool(options.get("include_usage")))
