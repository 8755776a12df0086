"""Rows passed between the modules of a bench as dataclasses: `JsonRow.to_json()` is the row of
results.json, its keys in the fields' order, leaving out each field no step set (`UNSET`), so a
row carries the keys it always had (None is written as null)."""

from __future__ import annotations

import dataclasses
from typing import Any


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
"""A row field no step set: `to_json` leaves its key out."""


class JsonRow:
    """Base of a row dataclass (kiln.bench.train_llm.llm_train_result.TrainRow, gpt-fast's GptFastRow,
    kiln.bench.llm.llm_engine_row.EngineRow)."""

    def get(self, name: str) -> Any:
        """The field's value, None when it was never set."""
        value = getattr(self, name)
        return None if value is UNSET else value

    def update(self, **fields: Any) -> Any:
        """Set `fields` (names of this dataclass: an unknown one is a TypeError); returns the row."""
        for name, value in fields.items():
            if not hasattr(self, name):
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            setattr(self, name, value)
        return self

    def to_json(self) -> dict[str, Any]:
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not UNSET}  # type: ignore[arg-type]
