"""`kiln serve`: an exported model behind an OpenAI-compatible HTTP endpoint, with continuous batching.

Argument parsing only: the flags come from kiln.serve.serve_options.ServeOptions and
kiln.serve.server.run_serve checks them (before the model is built) and serves until a signal.
"""

from __future__ import annotations

import argparse
import sys

from kiln.config.options import add_flags, from_namespace
from kiln.serve.serve_options import ServeOptions


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP, OpenAI-compatible (/v1/completions, /v1/chat/completions), continuous batching",
        description="Serve a model directory (kiln export or Hugging Face layout) on an OpenAI-compatible HTTP API: "
        "/v1/completions, /v1/chat/completions (streaming or not), /v1/models, /health, /metrics. Requests join "
        "the running decode batch as rows free up; --max-batch rows of --max-seq-len slots are allocated at "
        "start and --max-queue more requests may wait, beyond which the server answers 429. Needs "
        "pip install 'kiln[serve]'.",
    )
    add_flags(p, ServeOptions)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.serve.server import run_serve

    return run_serve(from_namespace(ServeOptions, args), say=lambda line: print(line, file=sys.stderr, flush=True))
