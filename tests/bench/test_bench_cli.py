"""`kiln bench compile` on the command line: exit 2 on bad input, presets end to end."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--modes", "max-performance"], ["--modes", "max-autotune"]),
        (["--backends", "nvfuser"], ["--backends", "inductor"]),
        (["--precisions", "fp8"], ["--precisions", "bf16-mixed"]),
        (["--scopes", "everything"], ["--scopes", "model+loss"]),
        (["--losses", "mse"], ["--losses", "distill"]),
        (["--preset", "seed999"], ["--preset", "seed000-levels", "seed001-vit"]),
        (["--config", "does/not/exist.toml"], ["does/not/exist.toml", "not found"]),
        (["--steps", "0"], ["--steps", ">= 1"]),
        (["--modes", "reduce-overhead", "compile.options.max_autotune=true"], ["compile.options", "mode"]),
        (["--config", "a.toml", "--model", "mlp"], ["--model", "not allowed"]),
        (["training.stpes=3"], ["training.stpes", "steps"]),
    ],
)
def test_bad_input_exits_2_with_one_line_before_any_work(tmp_path, bad_input, args, needles):
    out = tmp_path / "out"
    bad_input(["bench", "compile", "--out", str(out), *args], needles)
    assert not out.exists()


def test_an_earlier_run_in_out_is_refused_and_kept(tmp_path, bad_input):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.md").write_text("earlier")
    bad_input(["bench", "compile", "--model", "mlp", "--out", str(out)], ["--out", "already holds results", "results.md"])
    assert [p.name for p in out.iterdir()] == ["results.md"] and (out / "results.md").read_text() == "earlier"


def test_bench_without_a_subcommand_exits_2(capsys):
    assert main(["bench"]) == 2


def test_seed000_preset_end_to_end_with_tiny_sizes(tmp_path, tiny_mlp):
    out = tmp_path / "levels"
    code = main(["bench", "compile", "--preset", "seed000-levels", "--precisions", "fp32", "--steps", "3",
                 "--warmup", "1", "--warm-cache", "--out", str(out), *tiny_mlp])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = payload["results"]
    assert [r["mode"] for r in rows] == [
        "eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
    assert payload["config"]["bench"]["preset"] == "seed000-levels"
    assert payload["config"]["base"]["model"]["kwargs"]["hidden_size"] == 32  # the override beat the preset
    assert payload["config"]["base"]["data"]["batch_size"] == 8
    by_mode = {r["mode"]: r for r in rows}
    for mode in ("default", "max-autotune-no-cudagraphs"):
        assert by_mode[mode]["status"] == "ok" and by_mode[mode]["compile_s"] is not None
        assert by_mode[mode]["accuracy"] == "pass"
    for mode in ("reduce-overhead", "max-autotune"):
        assert by_mode[mode]["status"] == "skipped" and "CUDA graphs" in by_mode[mode]["reason"]
    assert (out / "results.png").exists() and (out / "results.md").exists()


def test_seed001_preset_code_path_with_a_tiny_vit(tmp_path, tiny_vit):
    out = tmp_path / "vit"
    code = main(["bench", "compile", "--preset", "seed001-vit", "--precisions", "fp32", "--backends", "aot_eager",
                 "--scopes", "model,model+loss", "--steps", "2", "--warmup", "1", "--accuracy-steps", "2",
                 "--out", str(out), *tiny_vit])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    got = [(r["loss"], r["mode"], r["backend"], r["scope"], r["status"]) for r in rows]
    assert got == [
        ("task", "eager", None, None, "ok"),
        ("task", "default", "aot_eager", "model", "ok"),
        ("distill", "eager", None, None, "ok"),
        ("distill", "default", "aot_eager", "model", "ok"),
        ("distill", "default", "aot_eager", "model+loss", "ok"),
    ]
    assert all(r["model"] == "vit" for r in rows)


def test_eager_in_modes_is_the_baseline_not_an_error(capsys):
    import sys

    from kiln.bench.compile.compile_command import check_compile
    from kiln.bench.compile.compile_request import CompileRequest
    from kiln.cli.main import build_parser
    from kiln.config.options import from_namespace

    def planned(*flags):
        args = build_parser().parse_args(["bench", "compile", "--model", "mlp", "--device", "cpu", *flags])
        job = check_compile(from_namespace(CompileRequest, args), say=lambda line: print(line, file=sys.stderr))
        return [(r.mode, r.precision) for r in job.opts.recipes], capsys.readouterr().err

    rows, err = planned("--modes", "eager,default")
    assert rows == [("eager", "fp32"), ("default", "fp32")]
    assert err.count("eager is always run as the baseline") == 1 and "ignored" in err
    rows, err = planned("--modes", "eager", "--precisions", "fp32,bf16-mixed")
    assert rows == [("eager", "fp32"), ("eager", "bf16-mixed")] and "eager rows only" in err
    rows, _ = planned("--preset", "seed000-levels", "--modes", "eager,reduce-overhead", "--precisions", "fp32")
    assert rows == [("eager", "fp32"), ("reduce-overhead", "fp32")]



@pytest.mark.parametrize("command", ["compile", "llm", "scale", "comm", "predict"])
def test_every_bench_help_shows_defaults(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", command, "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # help wraps lines
    assert "(default: " in text
    assert "(default: None)" not in text and "(default: False)" not in text and "(default: True)" not in text
    expected = {"compile": "interleaved with eager (default: 20)", "llm": "random weights (default: 0)",
                "scale": "per collective size (default: 20)", "comm": "timed samples per size (default: 20)",
                "predict": "efficiency bars (default: 2:85,4:80,8:75)"}[command]
    assert expected in text
    if command != "predict":
        assert "--verbose" in text


def test_help_shows_a_default_once():
    import argparse

    from kiln.cli.args import DefaultsFormatter

    parser = argparse.ArgumentParser(formatter_class=DefaultsFormatter)
    parser.add_argument("--a", type=int, default=3, help="stated (default 3)")
    parser.add_argument("--b", type=int, default=4, help="not stated")
    parser.add_argument("--c", action="store_true", help="a switch")
    text = " ".join(parser.format_help().split())
    assert "stated (default 3) --b" in text and "not stated (default: 4)" in text and "a switch" in text
    assert "(default: False)" not in text


def test_a_second_bench_on_the_same_out_is_refused(tmp_path, bad_input):
    from kiln.outputs import RunDirLock

    out = tmp_path / "out"
    with RunDirLock(out):  # a first bench, still measuring, holds its --out
        bad_input(["bench", "compile", "--model", "mlp", "--out", str(out)], ["--out", "in use by a running kiln"])
    assert [p.name for p in out.iterdir()] == []


def test_an_out_that_cannot_be_written_is_refused_before_any_work(tmp_path, bad_input):
    (tmp_path / "file").write_text("x")
    bad_input(["bench", "compile", "--model", "mlp", "--out", str(tmp_path / "file" / "out")],
              ["--out", "cannot create it"])
