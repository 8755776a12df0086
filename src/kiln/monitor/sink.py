"""The interface every metrics sink implements (kiln.monitor.sinks builds and drives them; the
Prometheus endpoint, kiln.monitor.prometheus, is one), in a module of its own so that a sink
defined elsewhere does not import the module that assembles them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class MetricsSink:
    """One destination for metric records."""

    def log(self, record: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release resources; safe to call twice."""

    def waiting(self, message: str) -> None:
        """The loop is busy with something long before its next record (the first step's compile):
        sinks that a person watches say so; the others ignore it."""


def scalars(record: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    """(tag, value) for every number in a record: numeric keys as they are, per-rank lists
    (`*_ranks`) as `key/rank_N`. bool is an int subclass but not a metric worth a chart; strings
    and other lists (`stragglers`, throttle reason names) are labels, counted elsewhere."""
    for key, value in record.items():
        if key == "step" or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            yield key, value
        elif key.endswith("_ranks") and isinstance(value, (list, tuple)):
            for rank, item in enumerate(value):
                if isinstance(item, (int, float)) and not isinstance(item, bool):
                    yield f"{key}/rank_{rank}", item
