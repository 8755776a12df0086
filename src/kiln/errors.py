"""The one error type for bad input; the CLI turns it into a one-line message and exit code 2."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """Bad user input, found before any work starts.

    `key` is the dotted config key (or a path / CLI flag) at fault; `choices`, when known, are the
    valid values, so the message can say what would have been accepted.
    """

    def __init__(self, key: str, message: str, choices: Iterable[str] | None = None, *, source: str | None = None):
        self.key = key
        self.message = message
        self.choices = tuple(choices) if choices is not None else None
        self.source = source
        """The file the bad value came from (a --config file), named first in the message."""
        text = f"{source}: {key}: {message}" if source else f"{key}: {message}"
        if self.choices:
            shown = ", ".join(self.choices[:40])
            more = f", ... ({len(self.choices) - 40} more)" if len(self.choices) > 40 else ""
            text += f" (valid: {shown}{more})"
        super().__init__(text)

    def in_file(self, path: str) -> ConfigError:
        """The same error, naming the file the value came from."""
        return ConfigError(self.key, self.message, self.choices, source=path)
