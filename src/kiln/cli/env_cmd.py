"""`kiln env [--json]`: versions, devices, compilers, backends and recommended settings."""

from __future__ import annotations

import argparse
import json

from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace
from kiln.monitor.env_request import EnvRequest


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="report torch, CUDA, GPUs, compilers, compile backends, recommendations",
                       description="What this machine offers kiln: torch and CUDA versions, GPUs (name, memory, "
                       "compute capability), C/Triton compilers, torch.compile modes and backends, and recommended "
                       "settings for it.")
    add_flags(p, EnvRequest)
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.monitor.env import collect_env, render_env

    request = from_namespace(EnvRequest, args)
    env = collect_env()
    if request.json:
        print(json.dumps(env, indent=2, default=str))
        return 0
    from rich.console import Console

    Console().print(render_env(env))
    return 0
