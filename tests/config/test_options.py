"""kiln.config.options' shapes beyond the ones every converted command exercises: a `bool | None`
pair (`--x` / `--no-x`), Path values, at least one positional word, a required exclusive pair."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiln.config.options import add_flags, command_line, flag_names, from_namespace, option, options_of


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(message)


@dataclass(kw_only=True)
class _Request:
    words: list[str] = option(shape="words", required=True, metavar="TEXT", help="one or more words")
    tokenizer: Path | None = option(None, metavar="DIR", exclusive="how", required=True, help="a directory")
    vocab: int | None = option(None, metavar="VOCAB", exclusive="how", help="a size")
    out: Path = option(required=True, help="where")
    train: bool | None = option(None, shape="yes_no", help="forward and backward")
    kwarg: list[str] = option(default_factory=list, shape="repeat", metavar="KEY=VALUE", help="repeatable")


def _parse(argv: list[str]) -> _Request:
    parser = _Parser()
    add_flags(parser, _Request)
    return from_namespace(_Request, parser.parse_args(argv))


def test_a_yes_no_pair_gives_true_false_or_none():
    base = ["a", "--tokenizer", "t", "--out", "o"]
    assert _parse(base).train is None
    assert _parse([*base, "--train"]).train is True
    assert _parse([*base, "--no-train"]).train is False
    assert _parse([*base, "--train", "--no-train"]).train is False  # the last one given wins
    train = next(f for f, _ in options_of(_Request) if f.name == "train")
    assert flag_names(_Request, train) == ["--train", "--no-train"]


def test_the_command_line_writes_the_pair_back():
    request = _Request(words=["a"], tokenizer=Path("t"), out=Path("o"), train=False)
    assert command_line(["tool"], request) == "tool a --tokenizer t --out o --no-train"
    assert command_line(["tool"], _Request(words=["a"], tokenizer=Path("t"), out=Path("o"), train=True)).endswith(
        " --train")


def test_path_fields_parse_as_paths_and_repeats_collect_in_order():
    got = _parse(["a", "b", "--tokenizer", "t/dir", "--out", "o", "--kwarg", "x=1", "--kwarg", "y=2"])
    assert got == _Request(words=["a", "b"], tokenizer=Path("t/dir"), out=Path("o"), kwarg=["x=1", "y=2"])
    assert isinstance(got.out, Path) and isinstance(got.tokenizer, Path)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tokenizer", "t", "--out", "o"], "the following arguments are required: TEXT"),
    (["a", "--out", "o"], "one of the arguments --tokenizer --vocab is required"),
    (["a", "--tokenizer", "t", "--vocab", "300", "--out", "o"], "argument --vocab: not allowed with argument --tokenizer"),
    (["a", "--vocab", "300"], "the following arguments are required: --out"),
])
def test_required_words_flags_and_exclusive_pairs_are_usage_errors(argv, message):
    with pytest.raises(ValueError, match=message):
        _parse(argv)


def test_one_flag_of_the_required_pair_is_enough():
    assert _parse(["a", "--vocab", "300", "--out", "o"]) == _Request(words=["a"], vocab=300, out=Path("o"))
