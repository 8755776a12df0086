"""The one error type for bad input; the CLI turns it into a one-line message and exit code 2."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """Bad user input, found before any work starts.

    `key` is the dotted config key (or a path / CLI flag) at fault; `choices`, when known, are the
    valid values, so the message can say what would have been accepted.
    """

    def __init__(self, key: str, message: str, choices: Iterable[str] | None = None):
        self.key = key
        self.choices = tuple(choices) if choices is not None else None
        text = f"{key}: {message}"
        if self.choices:
            shown = ", ".join(self.choices[:40])
            more = f", ... ({len(self.choices) - 40} more)" if len(self.choices) > 40 else ""
            text += f" (valid: {shown}{more})"
        super().__init__(text)
