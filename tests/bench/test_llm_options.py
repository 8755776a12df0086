"""kiln.bench.llm.llm_options: `kiln bench llm`'s request (kiln.bench.llm.llm_request) is checked once, in the library.

The CLI only turns flags into LlmBenchOptions; check_options is the one place a bad value is
found, and it names the flag (with the valid choices where there is a list)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json

import pytest

from kiln.bench.llm.llm_options import PRESETS, LlmBenchPlan, check_options
from kiln.bench.llm.llm_request import LlmBenchOptions
from kiln.cli import bench_llm_cmd
from kiln.cli.main import build_parser
from kiln.config.options import flag_of
from kiln.errors import ConfigError
from kiln.llm.quant import QuantSpec


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llm-options")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64}))
    return folder


def _opts(tiny, **change) -> LlmBenchOptions:
    return LlmBenchOptions(**{"model": str(tiny), "prompt_len": 20, "new_tokens": 8, "device": "cpu", **change})


def test_a_good_request_becomes_a_resolved_plan(tiny):
    plan = check_options(_opts(tiny, engines=["kiln-eager"], quants=["none", "int8@torch"], inductor=["max_autotune=true"]))
    assert isinstance(plan, LlmBenchPlan)
    assert plan.engines == ["kiln-eager"] and plan.dtype == "fp32" and plan.device == "cpu"
    assert (plan.batches, plan.prompt_len, plan.new_tokens) == ((1,), 20, 8)
    assert check_options(_opts(tiny, batch=[1, 4, 16])).batches == (1, 4, 16)
    assert plan.quants["none"] == QuantSpec() and plan.quants["int8@torch"].kind == "int8"
    assert plan.inductor_options == {"max_autotune": True}
    assert plan.ppl_max_tokens == 16384 and plan.gpt_fast is None


def test_the_preset_fills_what_is_not_given():
    preset = PRESETS["seed002-llama3b"]
    plan = check_options(LlmBenchOptions(preset=preset.name, device="cpu", new_tokens=4, engines=["kiln-eager"]))
    assert plan.model == preset.model and plan.preset == preset.name
    assert (plan.batches, plan.prompt_len, plan.new_tokens) == ((preset.batch,), preset.prompt_len, 4)


@pytest.mark.parametrize(("change", "flag", "needle"), [
    ({"engines": ["vllm"]}, "--engines", "kiln-compiled"),
    ({"engines": ["kiln-eager", "kiln-eager"]}, "--engines", "twice"),
    ({"preset": "seed003"}, "--preset", "seed002-llama3b"),
    ({"model": None}, "--model", "llama-3.2-1b"),
    ({"batch": [0]}, "--batch", ">= 1"),
    ({"batch": [1, 4, 1]}, "--batch", "twice"),
    ({"batch": list(range(1, 10))}, "--batch", "at most 8"),
    ({"repeats": 0}, "--repeats", ">= 1"),
    ({"ppl_context": 1}, "--ppl-context", ">= 2"),
    ({"dtype": "fp8"}, "--dtype", "bf16"),
    ({"device": "gpu"}, "--device", "not a device"),
    ({"prefill": "lazy"}, "--prefill", "eager"),
    ({"tuning": "max"}, "--tuning", "decode"),
    ({"deadline_s": 0.0}, "--deadline-s", "> 0"),
    ({"profile_decode": 6}, "--profile-decode", "at most 5"),
    ({"new_tokens": 300}, "--new-tokens", "positions"),
    ({"quants": ["int3"]}, "--quant", "nf4"),
    ({"quants": ["int8", "int8"]}, "--quant", "twice"),
    ({"quants": ["int8"], "engines": ["hf-eager"]}, "--quant", "kiln's engines"),
    ({"quants": ["int8"], "quant_backend": "cutlass"}, "--quant-backend", "inductor"),
    ({"inductor": ["max_autotune"]}, "--inductor", "KEY=VALUE"),
    ({"inductor": ["coordinate_descent_tunin=1"]}, "--inductor", "coordinate_descent_tuning"),
    ({"decode_attention": "paged"}, "--decode-attention", "matmul"),
    ({"decode_matvec": "cublas"}, "--decode-matvec", "inductor"),
    ({"ppl_file": "no/such/file.txt"}, "--ppl-file", "cannot read"),
    ({"gpt_fast": "no/such/checkout"}, "--gpt-fast", "no/such/checkout"),
])
def test_the_library_names_the_flag_of_a_bad_value(tiny, change, flag, needle):
    with pytest.raises(ConfigError) as info:
        check_options(_opts(tiny, **change))
    assert info.value.key == flag
    assert needle in str(info.value)


def test_the_cli_builds_options_without_checking_them(tiny):
    """Bad values pass the CLI's own code untouched: only argparse types and the library judge them."""
    args = build_parser().parse_args([
        "bench", "llm", "--model", str(tiny), "--engines", "vllm,kiln-eager", "--dtype", "fp8", "--device", "gpu",
        "--batch", "0,4", "--batch", "16", "--quant", "int3", "--prefill", "lazy", "--tuning", "max", "--deadline-s", "0",
        "--inductor", "not-an-option", "--gpt-fast-quant", "int2"])
    opts = bench_llm_cmd.options(args)
    assert opts == LlmBenchOptions(model=str(tiny), engines=["vllm", "kiln-eager"], dtype="fp8", device="gpu", batch=[0, 4, 16],
                                   quants=["int3"], prefill="lazy", tuning="max", deadline_s=0.0,
                                   inductor=["not-an-option"], gpt_fast_quants=["int2"])
    with pytest.raises(ConfigError) as info:
        check_options(opts)
    assert info.value.key == "--engines"


def test_the_cli_module_holds_no_checks():
    """No ConfigError is raised (or imported) in the command module: every check is check_options'."""
    tree = ast.parse(inspect.getsource(bench_llm_cmd))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    raises = [n for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    assert "ConfigError" not in names and not raises


def test_every_option_field_is_documented():
    """A plan field has a docstring; an option field's documentation is its flag's help."""
    for f in dataclasses.fields(LlmBenchOptions):
        assert flag_of(f) is not None and flag_of(f).help.strip(), f.name
    tree = ast.parse(inspect.getsource(inspect.getmodule(LlmBenchPlan)))
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LlmBenchPlan"):
        body = cls.body
        fields = [i for i, n in enumerate(body) if isinstance(n, ast.AnnAssign)]
        assert fields
        for i in fields:
            nxt = body[i + 1] if i + 1 < len(body) else None
            assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), (cls.name, body[i].target.id)
