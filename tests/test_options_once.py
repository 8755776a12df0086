"""Each converted command's options are defined once (kiln.config.options): the argparse flags, their
defaults, the request and the recorded command line all come from one dataclass, and the command
module only parses, calls the library and prints (no ConfigError of its own)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import shlex
import typing
from pathlib import Path

import pytest

from kiln.bench.compile.compile_request import CompileRequest
from kiln.bench.llm.llm_request import LlmBenchOptions
from kiln.bench.scale.scale_request import CommRequest, PredictRequest, ScaleRequest
from kiln.bench.train_llm.llm_train_request import TrainLlmRequest
from kiln.checkpoint.export_request import ExportRequest
from kiln.cli import (
    autotune_cmd,
    autotune_llm,
    bench_cmd,
    bench_llm_cmd,
    bench_scale_cmd,
    bench_train_llm_cmd,
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
from kiln.cli.main import build_parser
from kiln.config.options import command_line, default_of, flag_name, flag_names, flag_of, from_namespace
from kiln.data.prepare_options import PrepareOptions
from kiln.diagnose.diagnose_request import DoctorRequest, ExplainRequest
from kiln.generate.request import GenerateOptions
from kiln.monitor.env_request import EnvRequest
from kiln.profile.profile_request import ProfileRequest
from kiln.report.report_request import ReportRequest
from kiln.serve.serve_options import ServeOptions
from kiln.train.train_options import TrainOptions
from kiln.tune.autotune_request import AutotuneRequest

# (command words after `kiln`, options class, words the recorded command line starts with or None,
#  the flags a minimal command line needs)
COMMANDS = [
    (("bench", "llm"), LlmBenchOptions, bench_llm_cmd.WORDS, {}),
    (("bench", "compile"), CompileRequest, bench_cmd.WORDS, {}),
    (("generate",), GenerateOptions, None, {"model": "m"}),
    (("serve",), ServeOptions, None, {"model": "m"}),
    (("bench", "scale"), ScaleRequest, None, {}),
    (("bench", "comm"), CommRequest, None, {}),
    (("bench", "predict"), PredictRequest, None, {"points": "p.json", "out": "o"}),
    (("bench", "train-llm"), TrainLlmRequest, None, {}),
    (("autotune",), AutotuneRequest, autotune_cmd.WORDS, {}),
    (("env",), EnvRequest, None, {}),
    (("profile",), ProfileRequest, None, {}),
    (("report",), ReportRequest, None, {"path": "runs/a"}),
    (("train",), TrainOptions, None, {}),
    (("export",), ExportRequest, None, {"run_dir": Path("runs/a"), "out": Path("m.safetensors")}),
    (("data", "prepare"), PrepareOptions, None, {"inputs": ["t.txt"], "tokenizer": Path("tok"), "out": Path("o")}),
    (("explain",), ExplainRequest, None, {"target": "mlp"}),
    (("doctor",), DoctorRequest, None, {"target": "mlp"}),
]
CLI_MODULES = [bench_cmd, bench_llm_cmd, generate_cmd, bench_scale_cmd, bench_train_llm_cmd, autotune_cmd,
               autotune_llm, data_cmd, doctor_cmd, env_cmd, explain_cmd, export_cmd, profile_cmd, report_cmd, serve_cmd,
               train_cmd]
NOT_OPTIONS = {"-h", "--help", "--verbose"}


def _subparser(words: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _parse(words: tuple[str, ...], cls: type, argv: list[str]):
    return from_namespace(cls, build_parser().parse_args([*words, *argv]))


def _flag_argv(cls: type, f: dataclasses.Field, value) -> list[str]:
    """The words that give field `f` the value `value`."""
    shape, flag = flag_of(f).shape, flag_name(f)
    if shape == "switch":
        return [flag] if value else []
    if shape in ("tri", "yes_no"):
        return [flag_names(cls, f)[0 if value else 1]]
    if shape == "on_off":
        return [flag, "on" if value else "off"]
    if shape == "pick":
        return ["--" + value]
    if shape == "words":
        return list(value)
    if shape == "arg":
        return [str(value)]
    if shape == "repeat":
        return [w for item in value for w in (flag, str(item))]
    if shape in ("comma", "comma_each", "chunks"):
        return [flag, ",".join(map(str, value))]
    return [flag, str(value)]


def _argv(cls: type, values: dict) -> list[str]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return [w for name, value in values.items() for w in _flag_argv(cls, fields[name], value)]


def _field(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _changed(cls: type, f: dataclasses.Field):
    """A value of `f` that is not its default, of the field's type."""
    shape, default = flag_of(f).shape, default_of(f)
    hint = typing.get_type_hints(cls)[f.name]
    if shape in ("switch", "on_off"):
        return not default
    if shape == "pick":
        return next(c for c in typing.get_args(hint) if c != default)
    if shape == "words":
        return ["a.b=1", "c=2"]
    if shape == "chunks":  # kept as given: one chunk, recorded as it was typed
        return ["b,a"]
    if shape in ("tri", "yes_no"):
        return not default
    if shape in ("comma", "comma_each", "repeat"):
        item = typing.get_args(typing.get_args(hint)[0] if typing.get_origin(hint) is not list else hint)
        return [2, 3] if item and item[0] is int else ["x=1", "y=2"] if shape == "repeat" else ["b", "a"]
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if flag_of(f).choices:
        return next(c for c in flag_of(f).choices if c != default)
    if kinds[0] is int:
        return (default or 0) + 7
    if kinds[0] is float:
        return (default or 0.0) + 2.5
    if kinds[0] is Path:
        return Path("some/path")
    return "some value"


@pytest.mark.parametrize(("words", "cls", "record", "needed"), COMMANDS, ids=lambda c: getattr(c, "__name__", None))
def test_every_field_is_one_flag_and_every_flag_one_field(words, cls, record, needed):
    fields = dataclasses.fields(cls)
    assert all(flag_of(f) is not None and flag_of(f).help.strip() for f in fields), \
        [f.name for f in fields if flag_of(f) is None]
    actions = [a for a in _subparser(words)._actions if not set(a.option_strings) & NOT_OPTIONS]
    assert {a.dest for a in actions} == {f.name for f in fields}
    flags = {s for a in actions for s in a.option_strings}
    assert flags == {s for f in fields for s in flag_names(cls, f)}


@pytest.mark.parametrize(("words", "cls", "record", "needed"), COMMANDS, ids=lambda c: getattr(c, "__name__", None))
def test_the_parsed_defaults_are_the_dataclass_defaults(words, cls, record, needed):
    assert _parse(words, cls, _argv(cls, needed)) == cls(**needed)


@pytest.mark.parametrize(("words", "cls", "record", "given"), COMMANDS, ids=lambda c: getattr(c, "__name__", None))
def test_every_value_round_trips_through_its_flag(words, cls, record, given):
    """Each field set away from its default, on its own, is parsed back from its flag; where the
    command records its command line, that line parses back to the same request."""
    for f in dataclasses.fields(cls):
        exclusive = flag_of(f).exclusive
        needed = {k: v for k, v in given.items()  # one flag of an exclusive group replaces the others
                  if k == f.name or exclusive is None or flag_of(_field(cls, k)).exclusive != exclusive}
        opts = cls(**{**needed, f.name: _changed(cls, f)})
        if record is not None:
            line = shlex.split(command_line(record, opts))
            assert line[:len(record)] == record
            assert _parse(words, cls, line[len(record):]) == opts, f.name
        else:
            others = {k: v for k, v in needed.items() if k != f.name}
            assert _parse(words, cls, _argv(cls, others) + _flag_argv(cls, f, getattr(opts, f.name))) == opts, f.name


RECORDED = [  # command lines recorded in committed results (benchmarks/results/)
    (LlmBenchOptions, "kiln bench llm --model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --device auto --dtype auto "
     "--warmup 1 --repeats 3 --prefill-repeats 10 --seed 0 --prefill eager --profile-decode 64 "
     "--out /root/out/r/decode_prof --engines kiln-compiled --quant none,int4"),
    (LlmBenchOptions, "kiln bench llm --device auto --dtype auto --warmup 1 --repeats 3 --prefill-repeats 10 --seed 0"),
    (CompileRequest, "kiln bench compile --model timm:vit_base_patch16_224 --preset seed001-vit --modes default "
     "--precisions bf16-mixed --backends inductor --scopes model --losses task --cudagraphs off --regional off "
     "--baseline plain --steps 60 --warmup 3 --accuracy-steps 0 --out /root/out/r/vit_clip0 --warm-cache "
     "training.grad_clip=0"),
    (CompileRequest, "kiln bench compile --preset seed000-levels --modes default,reduce-overhead --precisions fp32 "
     "--cudagraphs off,on --regional on --baseline plain --steps 40 --warmup 3 --accuracy-steps 3 "
     "--out /root/out/speed/mlp_fp32 --warm-start"),
]


@pytest.mark.parametrize(("cls", "line"), RECORDED)
def test_a_recorded_command_line_is_recorded_again_as_it_was(cls, line):
    words = shlex.split(line)
    opts = _parse(tuple(words[1:3]), cls, words[3:])
    assert command_line(words[:3], opts) == line


@pytest.mark.parametrize("module", CLI_MODULES, ids=lambda m: m.__name__)
def test_the_command_module_holds_no_checks(module):
    """No ConfigError is raised (or named) in a converted command module, nor any other error (a bare
    `raise` passing Ctrl-C on after a clean-up is fine): the library checks."""
    tree = ast.parse(inspect.getsource(module))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "ConfigError" not in names
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.exc is not None]


NOT_YET: set[str] = set()
"""kiln/cli modules that still check their input themselves; none may join them."""


def _raises_config_error(tree: ast.AST) -> bool:
    def name(node) -> str | None:
        node = node.func if isinstance(node, ast.Call) else node
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None

    return any(isinstance(n, ast.Raise) and n.exc is not None and name(n.exc) == "ConfigError" for n in ast.walk(tree))


def test_no_cli_module_raises_config_error():
    """The CLI parses, calls the library and prints: bad input is found (and named) by the library."""
    cli = Path(inspect.getfile(bench_cmd)).parent
    raising = {p.stem for p in cli.glob("*.py") if _raises_config_error(ast.parse(p.read_text(encoding="utf-8")))}
    assert raising == NOT_YET
