"""What `kiln env` is asked to do: one field per flag (kiln.config.options)."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.options import option


@dataclass
class EnvRequest:
    """`kiln env`'s request, one field per flag."""

    json: bool = option(False, shape="switch", help="print JSON instead of a table")
