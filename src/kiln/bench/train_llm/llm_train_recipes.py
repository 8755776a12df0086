"""The built-in kiln recipes of `kiln bench train-llm`, kept free of torch so `kiln --help` (which
lists them) starts without importing it."""

from __future__ import annotations

KILN_RECIPES: dict[str, list[str]] = {
    # What a user gets from `kiln train` with compile on: kiln's measured defaults for the family.
    "kiln": ["compile.enabled=true"],
    "kiln-eager": ["compile.enabled=false"],
    "kiln-regional": ["compile.enabled=true", "compile.regional=true"],
}
"""Built-in kiln recipes: overrides on top of the bench's base config (`--recipe` adds more)."""
