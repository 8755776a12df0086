"""The interface every metrics sink implements (kiln.monitor.sinks builds and drives them; the
Prometheus endpoint, kiln.monitor.prometheus, is one), in a module of its own so that a sink
defined elsewhere does not import the module that assembles them."""

from __future__ import annotations

from collections.abc import Mapping
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
