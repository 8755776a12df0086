"""`kiln <command>`: parse arguments, call the library, map errors to exit codes.

Exit codes (docs/architecture.md#exit-codes): 0 success, 2 bad input (ConfigError, named key and valid choices),
1 a failure while running (artifacts already written are kept): a few lines on stderr say what
failed, where, what was kept and what to do; the traceback goes to `error.log` in the command's
run or output directory (`--verbose` also prints it).
"""

from __future__ import annotations

import argparse
import sys

from kiln.errors import ConfigError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors are bad input too: exit 2, one line
        self.exit(EXIT_BAD_INPUT, f"kiln: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from kiln import __version__
    from kiln.cli import (
        advise_cmd,
        autotune_cmd,
        bench_cmd,
        data_cmd,
        doctor_cmd,
        env_cmd,
        explain_cmd,
        export_cmd,
        generate_cmd,
        profile_cmd,
        report_cmd,
        serve_cmd,
        train_cmd,
    )

    parser = _Parser(prog="kiln", description="Fast PyTorch training and inference, with evidence.")
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    train_cmd.add_parser(sub)
    env_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    explain_cmd.add_parser(sub)
    doctor_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    generate_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    profile_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    autotune_cmd.add_parser(sub)
    advise_cmd.add_parser(sub)
    data_cmd.add_parser(sub)
    return parser


# The trailing positional lists (`nargs="*"`) of the commands that take KEY=VALUE overrides.
TRAILING_WORDS = ("overrides", "words")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse `argv`, accepting KEY=VALUE overrides anywhere on the command line, as most CLIs do.

    argparse gives a `nargs="*"` positional only its first run of words: in
    `kiln train a=1 --run-dir R b=2`, `b=2` is left over. Left-over words that are not flags join
    the command's overrides after those argparse took (command-line order, so a later value of a
    key still wins); a left-over flag, or words for a command that takes none, stay an error.
    """
    args, extra = parser.parse_known_args(argv)
    dest = next((d for d in TRAILING_WORDS if isinstance(getattr(args, d, None), list)), None)
    unknown = [word for word in extra if dest is None or word.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{_suggestion(parser, args, unknown)}")
    if dest is not None:
        getattr(args, dest).extend(extra)
    return args


def _suggestion(parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]) -> str:
    """` (did you mean --steps?)`: the command's flags closest to the unrecognized ones, or nothing."""
    import difflib

    command = parser
    while True:  # down the chosen subcommands (`kiln bench llm`) to the parser that took the flags
        chosen = next((a.choices.get(getattr(args, a.dest, None) or "") for a in command._actions
                       if isinstance(a, argparse._SubParsersAction)), None)
        if chosen is None:
            break
        command = chosen
    flags = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
    close = [m for word in unknown if word.startswith("--")
             for m in difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.6)]
    return f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""


def _setup_logging() -> None:
    import logging
    import os

    class StderrHandler(logging.StreamHandler):
        """Writes to the sys.stderr of the moment, not the one at setup: `main()` called again in
        one process (tests, notebooks) with stderr redirected must not write to a closed stream."""

        @property
        def stream(self):
            return sys.stderr

        @stream.setter
        def stream(self, value) -> None:
            """logging.StreamHandler assigns a stream at construction; the property above ignores it."""

    rank = os.environ.get("RANK")
    prefix = f"kiln[rank {rank}]" if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else "kiln"
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(f"{prefix}: %(message)s"))
    logger = logging.getLogger("kiln")
    if not logger.handlers:
        logger.addHandler(handler)
    # Rank 0 tells what it decided (strategy, compile); other ranks speak up only about problems.
    logger.setLevel(logging.INFO if rank in (None, "0") else logging.WARNING)
    logger.propagate = False
    from kiln import noise

    noise.install()  # dependencies' deprecations and extension notices: to dependencies.log, not the console
    noise.NOISE.reset()  # this command's messages only, not those of earlier work in this process


def _own_output_dir(args: argparse.Namespace):
    """The command's output directory (`args.output_dir`, set by a command once the dir is its to
    write: `kiln train` once it holds the run dir's lock), or None when it has none or another live
    kiln process holds it: nothing that does not hold a run dir's lock writes in it."""
    from kiln.outputs import held_by_another

    out = getattr(args, "output_dir", None)
    return out if out is not None and held_by_another(out) is None else None


def _keep_noise(args: argparse.Namespace) -> None:
    """The filtered dependency messages go to the command's output directory, if it has one (else
    to the temp file kiln.noise names on stderr)."""
    from kiln.noise import keep

    keep(_own_output_dir(args))


def main(argv: list[str] | None = None) -> int:
    from kiln.cli.streams import guarded_output

    with guarded_output():  # a closed pipe or terminal stops the output, never the command
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    _setup_logging()
    parser = build_parser()
    args = parse_args(parser, argv)
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
    except Exception as exc:  # a failure while running: say what and where, keep what was written
        return _report_failure(exc, args)
    finally:
        _keep_noise(args)


def _report_failure(exc: Exception, args: argparse.Namespace) -> int:
    from kiln.failure import RunFailed, emit, generic_report, quiet_child_signals
    from kiln.failure.ranks import console_mode, publish

    with quiet_child_signals():
        # Commands that know their run build the report (train: step, checkpoint, summary); others
        # name their output directory (`args.output_dir`) for the log file.
        report = exc.report if isinstance(exc, RunFailed) else generic_report(exc, output_dir=_own_output_dir(args))
        emit(report, verbose=getattr(args, "verbose", False), mode=console_mode(report))
        publish(report)  # for a launcher: this rank's report, complete
        if isinstance(exc, RunFailed) and exc.after_report is not None:
            exc.after_report()
    return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
