"""argparse pieces the command modules share: the `--verbose` flag and the help formatter that shows
defaults. A module of its own so that command modules do not import kiln.cli.main, which imports
them."""

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
