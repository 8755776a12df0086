"""`kiln generate`: text (or token ids) from a Llama-family model through kiln's engine.

Argument parsing and printing only: the flags come from kiln.generate.request.GenerateOptions and
kiln.generate.generation.run_generate checks them (before the model is built) and generates.
"""

from __future__ import annotations

import argparse
import sys

from kiln.config.options import add_flags, from_namespace
from kiln.generate.request import GenerateOptions


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with kiln's fast decoder (static KV cache, compiled + CUDA-graphed decode)",
        description="Generate from a prompt. Text prompts need a tokenizer.json (the model directory's or "
        "--tokenizer); --tokens takes token ids and works with any model, presets included. Several "
        "--prompt/--tokens, or a --prompt-file with one prompt per line, form one batch.",
    )
    add_flags(p, GenerateOptions)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.generate.generation import run_generate

    gen = run_generate(from_namespace(GenerateOptions, args), say=lambda line: print(line, file=sys.stderr,
                                                                                     flush=True))
    for i, tokens in enumerate(gen.tokens):
        if len(gen.tokens) > 1:
            print(f"--- [{i}] ({gen.finish[i]}, {len(tokens)} tokens)")
        print(gen.texts[i] if gen.texts is not None else ",".join(map(str, tokens)))
    print(gen.summary(), file=sys.stderr)
    return 0
