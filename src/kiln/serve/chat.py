"""The model's chat template: `chat_template` of the model directory's tokenizer_config.json (or
a chat_template.jinja file beside it), rendered with jinja2 the way transformers'
apply_chat_template does (a sandboxed environment, trim_blocks/lstrip_blocks, `raise_exception`,
the tokenizer's special tokens as variables, `add_generation_prompt`), so a served model gets the
prompt text it was trained or fine-tuned on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln.serve.protocol import ApiError


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # transformers' AddedToken as saved: {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    def __init__(self, source: str, special: dict[str, str | None]):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        self.template = env.from_string(source)
        self.special = special
        self._error = jinja2.exceptions.TemplateError

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.special)
        except self._error as exc:
            raise ApiError(400, f"the model's chat template refused these messages: {exc}", param="messages",
                           code="chat_template_error") from None


def load_chat_template(directory: Path | None) -> ChatTemplate | None:
    """The directory's chat template, or None when it has none."""
    if directory is None:
        return None
    config_path = directory / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = {}
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(source, str) and (directory / "chat_template.jinja").is_file():
        source = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    if not isinstance(source, str):
        return None
    special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return ChatTemplate(source, special)
