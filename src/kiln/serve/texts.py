"""From a checked request to a scheduler job, and from its tokens back to text.

`Served` is what the server knows of its model (name, tokenizer, chat template, context, stop
tokens) and turns `Params` into a `Job`, refusing a prompt that cannot fit (400 naming it: the KV
rows are fixed, so an over-long request is an error, never an out-of-memory).
`TextStream` turns token ids into text as they come: it decodes only the newest tokens (with the
last ones before them as context) and sends what is new, holds back a trailing incomplete UTF-8
character and any tail that could still become a stop string, and ends the text at the first stop
string (OpenAI's `stop`, which is not part of the answer).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kiln.llm.tokenizer import Tokenizer
from kiln.serve.chat import ChatTemplate
from kiln.serve.protocol import COMPLETIONS_DEFAULT_MAX_TOKENS, ApiError, Params, bad
from kiln.serve.rows import RowSettings
from kiln.serve.scheduler import Job


@dataclass(frozen=True)
class Served:
    name: str
    tokenizer: Tokenizer | None
    template: ChatTemplate | None
    context: int
    """Slots per KV row: prompt + max_tokens must fit."""
    vocab_size: int
    stop_tokens: frozenset[int]

    def prompt_ids(self, params: Params) -> list[int]:
        if params.route == "chat":
            if self.template is None:
                raise ApiError(400, f"model {self.name!r} has no chat template (no chat_template in its "
                               "tokenizer_config.json): use /v1/completions", param="messages",
                               code="no_chat_template")
            return self._tokenizer("messages").encode(self.template.render(params.messages), special=False)
        if isinstance(params.prompt, str):
            return self._tokenizer("prompt").encode(params.prompt)
        bad_id = next((t for t in params.prompt if not 0 <= t < self.vocab_size), None)
        if bad_id is not None:
            raise bad("prompt", f"token id {bad_id} is outside the vocabulary [0, {self.vocab_size})")
        return list(params.prompt)

    def _tokenizer(self, param: str) -> Tokenizer:
        if self.tokenizer is None:
            raise bad(param, f"model {self.name!r} has no tokenizer.json: send the prompt as token ids")
        return self.tokenizer

    def job(self, params: Params) -> Job:
        if params.model is not None and params.model != self.name:
            raise ApiError(404, f"the model {params.model!r} does not exist; this server serves {self.name!r}",
                           param="model", code="model_not_found")
        prompt = self.prompt_ids(params)
        if not prompt:
            raise bad("prompt", "the prompt has no tokens")
        room = self.context - len(prompt)
        if room < 1:
            raise bad("messages" if params.route == "chat" else "prompt",
                      f"the prompt has {len(prompt)} tokens; this server's context is {self.context} tokens "
                      f"(--max-seq-len), so at most {self.context - 1} fit", "context_length_exceeded")
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = min(room, COMPLETIONS_DEFAULT_MAX_TOKENS) if params.route == "completions" else room
        if max_tokens > room:
            key = "max_completion_tokens" if params.route == "chat" and params.max_tokens is not None else "max_tokens"
            raise bad(key, f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds this server's "
                      f"context of {self.context} tokens; at most {room} new tokens fit", "context_length_exceeded")
        seed = params.seed if params.seed is not None else random.getrandbits(62)
        settings = RowSettings(params.temperature, params.top_k, params.top_p, seed)
        return Job(prompt, max_tokens, settings, self.stop_tokens)


class TextStream:
    def __init__(self, tokenizer: Tokenizer | None, stop: tuple[str, ...]):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.text = ""
        """The completion's text so far (what the tokens decoded to, up to the last complete character)."""
        self.prefix = 0
        self.read = 0
        """ids[prefix:read] are the tokens last decoded into `text`, decoded again as context for the
        next ones; ids[read:] are not in `text` yet."""
        self.sent = 0
        self.stopped = False

    def _decode_new(self, last: bool) -> None:
        """Add the text of ids[read:] to `text`, decoding only from `prefix` on (a few tokens, not the
        whole completion: this runs per token per stream). Decoded with the tokens before them and
        the text of those cut off, so a tokenizer that drops a leading space at the start of a
        decode drops it on both sides; held while it ends in an incomplete UTF-8 character."""
        before = self.tokenizer.decode(self.ids[self.prefix: self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        if len(after) > len(before) and (last or not after.endswith("\ufffd")):
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)

    def push(self, token: int, last: bool) -> str:
        """The new text after `token` (all that is left when `last`); sets `stopped` at a stop string."""
        if self.tokenizer is None or self.stopped:
            return ""
        self.ids.append(token)
        self._decode_new(last)
        text = self.text
        hits = [i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            return self._take(text, min(hits))
        if last:
            return self._take(text, len(text))
        end = len(text)
        held = max((n for s in self.stop for n in range(1, len(s)) if text[:end].endswith(s[:n])), default=0)
        return self._take(text, end - held)

    def _take(self, text: str, end: int) -> str:
        end = max(end, self.sent)
        out, self.sent = text[self.sent: end], end
        return out
