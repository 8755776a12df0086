"""What `kiln bench compile` is asked to do: `CompileRequest`, one field per flag
(kiln.config.options), unchecked; kiln.bench.compile.compile_command checks it. The recorded command line
comes from these fields, in field order. Imports no torch: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.options import option

AXES = ("modes", "precisions", "backends", "scopes", "losses", "cudagraphs", "regional", "baselines")
"""The recipe axes: comma-separated lists, each flag repeatable (kiln.bench.compile.recipes.Axes)."""


@dataclass
class CompileRequest:
    """`kiln bench compile`'s request, one field per flag."""

    config: str | None = option(None, exclusive="source", help="TOML config of the model/data/optimizer to benchmark")
    model: str | None = option(None, exclusive="source",
                               help="model spec (registry name, timm:<name>, hf:<...>, module:function)")
    preset: str | None = option(None, help="seed001-vit | seed000-levels (overrides and flags still apply)")
    modes: list[str] | None = option(None, shape="chunks", help="compile modes, e.g. default,reduce-overhead (eager "
                                     "is always the baseline; naming it is allowed)")
    precisions: list[str] | None = option(None, shape="chunks", help="fp32,bf16-mixed,fp16-mixed,bf16-true,bf16-master")
    backends: list[str] | None = option(None, shape="chunks", help="compile backends, e.g. inductor,aot_eager,cudagraphs")
    scopes: list[str] | None = option(None, shape="chunks", help="model,model/loss,model+loss,step")
    losses: list[str] | None = option(None, shape="chunks", help="task (the model's loss), distill (teacher KL + CE)")
    cudagraphs: list[str] | None = option(None, shape="chunks", metavar="off,on",
                                          help="whole-step CUDA-graph capture (compile.cudagraphs) off and/or on for "
                                          "each recipe; 'on' also adds eager with capture")
    regional: list[str] | None = option(None, shape="chunks", metavar="off,on",
                                        help="scope-model recipes compiled whole and/or block by block (compile.regional)")
    baselines: list[str] | None = option(None, name="--baseline", shape="chunks", metavar="plain",
                                         help="plain: add, for each mode, the loop a user writes by hand around "
                                         "torch.compile(model, mode)")
    train: bool | None = option(None, shape="tri", off="--infer|time inference forwards", help="time training steps")
    steps: int = option(20, record="always", help="timed samples per recipe, interleaved with eager")
    warmup: int = option(3, record="always", help="steps after the compiling one before timing")
    accuracy_steps: int = option(3, record="always", help="loss-trajectory steps; 0 = no accuracy check")
    batch_size: int | None = option(None, help="same as data.batch_size=N")
    device: str | None = option(None, help="same as training.device=... (auto, cpu, cuda, cuda:N)")
    out: str | None = option(None, help="output directory (default: runs/<time>-bench-compile-<name>)")
    warm_cache: bool = option(False, shape="switch", help="keep inductor's on-disk caches (default: cold compile)")
    warm_start: bool = option(False, shape="switch", help="also time each compiled recipe's compile from its saved "
                              "cache artifacts (warm restart)")
    overrides: list[str] = option(default_factory=list, shape="words", metavar="KEY=VALUE",
                                  help="config overrides, after --config/--preset")
