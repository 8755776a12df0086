"""What `kiln autotune` is asked to do: `AutotuneRequest`, one field per flag (kiln.config.options),
unchecked; kiln.tune.autotune_check checks it. The recorded command line comes from these fields, in field
order. Imports no torch: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.config.options import option

LLM = "LLM configs (model.name=llama:...): the knobs searched instead of compile recipes"


@dataclass
class AutotuneRequest:
    """`kiln autotune`'s request, one field per flag."""

    config: str | None = option(None, help="TOML config to tune (as for kiln train); default: kiln's built-in default")
    budget: float = option(10.0, record="always", metavar="MINUTES", help="time for the whole search, compiles "
                           "included (default 10); what does not fit is reported")
    out: str | None = option(None, help="output directory (default: runs/<time>-autotune-<model>)")
    precisions: str | None = option(None, metavar="LIST", help="precisions the search may use (a precision change "
                                    "changes the numerics; default: the config's own, plus bf16-mixed on a GPU with "
                                    "bf16; for an LLM config: bf16-mixed,bf16-master on a GPU when the config trains "
                                    "bf16 with AdamW)")
    modes: str | None = option(None, metavar="LIST", help="compile modes to search (default: default,reduce-overhead,"
                               "max-autotune-no-cudagraphs,max-autotune on a GPU; default,max-autotune-no-cudagraphs "
                               "on a CPU)")
    scopes: str | None = option(None, metavar="LIST",
                                help="compile scopes to search: model,model+loss,step (default all)")
    nproc_per_node: int | None = option(None, help="also compare distributed strategies (ddp, fsdp) of the winner "
                                        "over N processes (default: every GPU when there are several; none on a CPU)")
    steps: int = option(20, record="always",
                        help="timed samples per candidate (the final comparison takes twice as many)")
    warmup: int = option(3, record="always", help="steps after the compiling one before timing")
    device: str | None = option(None, help="same as training.device=... (auto, cpu, cuda, cuda:N)")
    batch_sizes: str | None = option(None, metavar="LIST", group=LLM,
                                     help="data.batch_size values (default: half to 4x the config's)")
    ac: str | None = option(None, metavar="LIST", group=LLM,
                            help="training.activation_checkpointing: none,selective,full (default all)")
    float8: str | None = option(None, metavar="LIST", group=LLM, help="precision.float8: none,tensorwise,rowwise "
                                "(default all on a GPU with float8 tensor cores and a bf16 policy, else none)")
    ce_kernels: str | None = option(None, metavar="LIST", group=LLM, help="training.ce_kernel: chunked,liger,plain,"
                                    "triton (default chunked and plain, triton on a GPU, liger where liger-kernel "
                                    "imports)")
    compile_scopes: str | None = option(None, metavar="LIST", group=LLM, help="regional (compile.regional), whole "
                                        "(the model), model+loss, off (default regional,whole)")
    loss_tol: float = option(0.02, record="always", group=LLM, help="relative loss difference a float8 candidate "
                             "may have from bf16 after its steps (default 0.02)")
    no_regional: bool = option(False, shape="switch", help="do not search regional compile")
    no_capture: bool = option(False, shape="switch",
                              help="do not search whole-step CUDA-graph capture (compile.cudagraphs)")
    rank_noisy: bool = option(False, shape="switch", help="let rows flagged too noisy to rank (wide p10-p90, "
                              "round-to-round drift) win anyway, e.g. on a shared machine that is never quiet; the "
                              "flags stay in the table (default: keep the config's own recipe)")
    overrides: list[str] = option(default_factory=list, shape="words", metavar="KEY=VALUE",
                                  help="config overrides, after --config")
