"""`kiln autotune` for an LLM config (`model.name=llama:...`): its flags, their checks (before any
work) and the run; the search is kiln.tune.llm_search. Other models take kiln.cli.autotune_cmd's
compile-recipe search."""

from __future__ import annotations

import argparse
import sys

from kiln.cli.args import check_budget, checked_list
from kiln.config.errors import ConfigError


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM configs (model.name=llama:...): the knobs searched instead of compile recipes")
    g.add_argument("--batch-sizes", metavar="LIST", help="data.batch_size values (default: half to 4x the config's)")
    g.add_argument("--ac", metavar="LIST", help="training.activation_checkpointing: none,selective,full (default all)")
    g.add_argument("--float8", metavar="LIST", help="precision.float8: none,tensorwise,rowwise (default all on a GPU "
                   "with float8 tensor cores and a bf16 policy, else none)")
    g.add_argument("--ce-kernels", metavar="LIST", help="training.ce_kernel: chunked,liger,plain,triton (default "
                   "chunked and plain, triton on a GPU, liger where liger-kernel imports)")
    g.add_argument("--compile-scopes", metavar="LIST",
                   help="regional (compile.regional), whole (the model), model+loss, off (default regional,whole)")
    g.add_argument("--loss-tol", type=float, default=0.02,
                   help="relative loss difference a float8 candidate may have from bf16 after its steps (default 0.02)")


def is_llm(cfg) -> bool:
    return cfg.model.name.startswith("llama:")


def _values(flag: str, raw: str | None, valid: tuple[str, ...], default: list[str]) -> list[str]:
    return checked_list(flag, raw, valid) or default


def _float8_here(cfg, device) -> tuple[list[str], str | None]:
    from kiln.train.float8 import check_float8

    try:
        check_float8("tensorwise", device, cfg.precision.policy)
    except ConfigError as exc:
        return ["none"], f"float8 not searched: {str(exc).split(': ', 1)[-1]}"
    return ["none", "tensorwise", "rowwise"], None


def _precisions_here(cfg, device) -> tuple[list[str], str | None]:
    """bf16-mixed and bf16-master for a bf16 AdamW config on a GPU (what the policy needs, config
    validation checks the rest per candidate); bf16-mixed on a CPU with native bf16 (as `kiln env`
    and `kiln advise` find it pays there); else the config's own policy only."""
    if device.type != "cuda":
        from kiln.precision import cpu_bf16_native

        if not cpu_bf16_native():
            return [], "precision policy not searched: this CPU has no native bf16 (AMX, AVX512-BF16): it is emulated"
        if cfg.precision.policy in ("fp32", "bf16-mixed"):  # bf16-master's fused update is a GPU kernel
            return ["bf16-mixed"], None
        return [], f"precision policy not searched: the config trains {cfg.precision.policy}"
    if cfg.precision.policy not in ("bf16-mixed", "bf16-master") or cfg.optim.name != "adamw":
        return [], (f"precision policy not searched: the config trains {cfg.precision.policy} with "
                    f"{cfg.optim.name}; bf16-master replaces bf16-mixed's AdamW")
    return ["bf16-mixed", "bf16-master"], None


def plan(args: argparse.Namespace, cfg):
    """(LlmTuneOptions, notes) for an LLM config; ConfigError on bad input."""
    import importlib.util

    from kiln.runtime import resolve_device
    from kiln.tune import llm_space as sp
    from kiln.tune.llm_search import LlmTuneOptions, configure

    check_budget(args)
    device = resolve_device(cfg.training.device)
    notes = []
    if args.batch_sizes is None:
        batches = sp.default_batches(cfg.data.batch_size)
    else:
        try:
            batches = sorted({int(b) for b in args.batch_sizes.split(",") if b.strip()})
        except ValueError:
            raise ConfigError("--batch-sizes", f"expected comma-separated integers, got {args.batch_sizes!r}") from None
        if not batches or batches[0] < 1:
            raise ConfigError("--batch-sizes", f"needs integers >= 1, got {args.batch_sizes!r}")
    float8_default, why = _float8_here(cfg, device)
    if why and args.float8 is None:
        notes.append(why)
    float8 = _values("--float8", args.float8, sp.FLOAT8, float8_default)
    precision_default, why = _precisions_here(cfg, device)
    if why and args.precisions is None:
        notes.append(why)
    precision = _values("--precisions", args.precisions, sp.PRECISIONS, precision_default)
    ce_default = (["chunked", "plain"] + (["triton"] if device.type == "cuda" else [])
                  + (["liger"] if importlib.util.find_spec("liger_kernel") else []))
    space = sp.LlmSpace(batches=batches, ac=_values("--ac", args.ac, sp.AC_MODES, list(sp.AC_MODES)),
                        ce=_values("--ce-kernels", args.ce_kernels, sp.CE_KERNELS, ce_default), float8=float8,
                        compile=_values("--compile-scopes", args.compile_scopes, sp.COMPILE_SCOPES,
                                        ["regional", "whole"]), precision=precision)
    if not args.loss_tol > 0:
        raise ConfigError("--loss-tol", f"must be > 0, got {args.loss_tol}")
    configure(cfg, sp.from_config(cfg))  # the config's own settings as a candidate: a key kiln refuses exits here
    ignored = [flag for flag, value in (("--modes", args.modes),
                                        ("--scopes", args.scopes), ("--nproc-per-node", args.nproc_per_node),
                                        ("--rank-noisy", args.rank_noisy or None))
               if value is not None]
    if ignored:
        notes.append(f"{', '.join(ignored)} not used: an LLM config searches the LLM knobs")
    opts = LlmTuneOptions(cfg=cfg, space=space, budget_s=args.budget * 60, steps=args.steps, warmup=args.warmup,
                          loss_tol=args.loss_tol)
    return opts, notes


def run(args: argparse.Namespace, cfg, command: str) -> int:
    opts, notes = plan(args, cfg)  # ConfigError -> exit 2 before any work


    import torch

    from kiln.cli.results import claim_results_dir, stopped_line
    from kiln.monitor.env import collect_env
    from kiln.runtime import resolve_device
    from kiln.tune.llm_output import result_rows, write_best, write_evidence
    from kiln.tune.llm_search import LlmSearch

    out = claim_results_dir(args, f"autotune-{cfg.model.name.replace('/', '_')}")
    device = resolve_device(cfg.training.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    def log(message: str) -> None:
        print(f"kiln: {message}", file=sys.stderr, flush=True)

    log(f"autotune (LLM) {cfg.model.name} on {where}, budget {args.budget:g} min: batch {opts.space.batches}, "
        f"ac {opts.space.ac}, ce {opts.space.ce}, precision {opts.space.precision or [cfg.precision.policy]}, "
        f"float8 {opts.space.float8}, compile {opts.space.compile}")
    for note in notes:
        log(note)
    result = LlmSearch(opts, log=log).run()
    result.notes[:0] = notes
    path = write_best(out, cfg, result, model=cfg.model.name, device=where)
    title = f"kiln autotune (LLM): {cfg.model.name} ({where})"
    written = write_evidence(out, cfg, result, opts, env=collect_env(), command=command, title=title)
    from kiln.bench.results import markdown_table
    from kiln.tune.llm_output import COLUMNS

    print(markdown_table(result_rows(result), COLUMNS))
    gain = result.speedup_vs_default
    print(f"kiln: winner {result.winner.describe()}" + (f" ({gain:.2f}x the config's own tokens/s)" if gain else "")
          + f"; {len(result.trials)} rows measured in {result.elapsed_s / 60:.1f} min, {len(result.not_tried)} not "
          f"tried; wrote {path}, {', '.join(str(p) for p in written)}")
    print(f"kiln: train with it: kiln train --config {path}")
    if line := stopped_line(result, out):
        print(line, file=sys.stderr)
    return 0
