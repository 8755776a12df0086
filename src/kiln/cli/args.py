"""argparse pieces the command modules share: the `--verbose` flag, the help formatter that shows
defaults, and the checks of comma-separated lists and of autotune's budget. A module of its own so
that command modules do not import kiln.cli.main, which imports them."""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.HelpFormatter):
    """`--help` shows each option's default, as argparse.ArgumentDefaultsHelpFormatter does, but only
    where there is one to show: not for switches (flags without a value), options that are unset
    (None) or whose help already states it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or action.nargs == 0 or default is None or default == argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="on a failure, also print the full traceback on stderr (it always goes to the log file the "
                             "message names: error.log in the run or output dir)")


def checked_list(flag: str, raw: str | None, valid: tuple[str, ...] | list[str] | None = None) -> list[str] | None:
    """A comma-separated flag's values (None when the flag was not given); ConfigError naming the
    flag for an empty list or a value outside `valid`."""
    from kiln.bench.recipes import split_values  # the library, only once a command runs
    from kiln.config.errors import ConfigError

    if raw is None:
        return None
    values = split_values([raw])
    if not values:
        raise ConfigError(flag, "needs at least one value", valid)
    for value in values:
        if valid is not None and value not in valid:
            raise ConfigError(flag, f"unknown value {value!r}", valid)
    return values


def check_budget(args: argparse.Namespace) -> None:
    """`kiln autotune`'s --budget (> 0 minutes), --steps (>= 3) and --warmup (>= 0)."""
    from kiln.config.errors import ConfigError

    if not args.budget > 0:
        raise ConfigError("--budget", f"must be > 0 minutes, got {args.budget}")
    for flag, value, minimum in (("--steps", args.steps, 3), ("--warmup", args.warmup, 0)):
        if value < minimum:
            raise ConfigError(flag, f"must be >= {minimum}, got {value}")
