"""What `kiln report` is asked to do: one field per flag (kiln.config.options), unchecked;
kiln.report.contents reads the dir and refuses a bad one."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.options import option


@dataclass
class ReportRequest:
    """`kiln report`'s request, one field per flag."""

    path: str = option(shape="arg", metavar="RUN_DIR|BENCH_DIR",
                       help="a kiln train/profile run dir or a kiln bench --out dir")
    out: str | None = option(None, help="where to write the report (default: into RUN_DIR|BENCH_DIR; refused while "
                             "a running kiln process holds that dir)")
