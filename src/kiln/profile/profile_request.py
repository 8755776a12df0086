"""What `kiln profile` is asked to do: one field per flag (kiln.config.options), unchecked;
kiln.profile.profile_run.profile_plan loads the config and checks the window."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.options import option


@dataclass
class ProfileRequest:
    """`kiln profile`'s request, one field per flag."""

    config: str | None = option(None, help="TOML config file (as for kiln train)")
    steps: int = option(10, help="profiled steps (default 10)")
    warmup: int = option(5, help="steps after the first (compiling) one before the window, >= 1 (default 5)")
    memory_steps: int = option(2, help="steps after the window with memory profiling and the CUDA allocator history "
                               "(0: none)")
    out: str | None = option(None, help="output directory (default: runs/<time>-profile-<model>)")
    overrides: list[str] = option(default_factory=list, shape="words", metavar="KEY=VALUE",
                                  help="config overrides, after --config (training.steps and intervals are set by "
                                  "the window)")
