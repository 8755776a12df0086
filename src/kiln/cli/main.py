"""`kiln <command>`: parse arguments, call the library, map errors to exit codes.

Exit codes (DESIGN.md): 0 success, 2 bad input (ConfigError, named key and valid choices),
1 a failure while running (artifacts already written are kept).
"""

from __future__ import annotations

import argparse
import sys
import traceback

from kiln.config.errors import ConfigError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors are bad input too: exit 2, one line
        self.exit(EXIT_BAD_INPUT, f"kiln: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from kiln.cli import bench_cmd, doctor_cmd, env_cmd, explain_cmd, export_cmd, generate_cmd, train_cmd

    parser = _Parser(prog="kiln", description="Fast PyTorch training and inference, with evidence.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    train_cmd.add_parser(sub)
    env_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    explain_cmd.add_parser(sub)
    doctor_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    generate_cmd.add_parser(sub)
    return parser


def _setup_logging() -> None:
    import logging
    import os

    rank = os.environ.get("RANK")
    prefix = f"kiln[rank {rank}]" if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else "kiln"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}: %(message)s"))
    logger = logging.getLogger("kiln")
    if not logger.handlers:
        logger.addHandler(handler)
    # Rank 0 tells what it decided (strategy, compile); other ranks speak up only about problems.
    logger.setLevel(logging.INFO if rank in (None, "0") else logging.WARNING)
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    _setup_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.run(args) or EXIT_OK)
    except ConfigError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a failure while running: show where, keep what was written
        traceback.print_exc()
        print(f"kiln: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
