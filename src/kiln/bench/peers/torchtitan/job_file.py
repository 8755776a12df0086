"""torchtitan as a row of `kiln bench train-llm`: its job file, its run, its figures.

torchtitan (0.2.2, installed beside kiln, never imported here) runs in its own process through the
small launcher torchtitan_llama.py (beside this module), which registers the model shape as a flavor
of torchtitan's llama3 model and records each logged step's metrics as JSON lines. The job is the
bench's: same shape, sequence, batch, steps, optimizer and schedule, the same initial weights
(loaded from the bench's Hugging Face directory through torchtitan's HF checkpoint reader), the
same text through the same tokenizer (torchtitan's own local-dataset path), logging every step.
torchtitan's single-GPU recipe: autocast to bf16 (FSDP is off at one rank), per-block compile of
the model and a compiled loss; activation checkpointing off unless overridden.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.config.load import tomllib
from kiln.distributed.launch import run_bounded
from kiln.llm.families import FAMILIES

FLAVOR = "kiln-bench"
TORCHTITAN_MODEL = "llama3"
"""The torchtitan model the launcher registers the flavor of: families whose spec names it as their
torchtitan peer (kiln.llm.families) run as this row."""


def launcher_path() -> Path:
    """The launcher script torchrun starts: torchtitan_llama.py beside this module (in the package,
    so an installed kiln has it too)."""
    return Path(__file__).resolve().with_name("torchtitan_llama.py")


def flavor_args(hf: dict[str, Any], seq_len: int) -> dict[str, Any] | str:
    """torchtitan TransformerModelArgs fields reproducing a Llama config.json, or why it cannot.

    torchtitan sizes the SwiGLU width as int(2/3 * 4 * dim), optionally times ffn_dim_multiplier,
    rounded up to a multiple of multiple_of: with multiple_of = intermediate_size that rounding lands
    on intermediate_size exactly whenever the product does not exceed it (a multiplier below 1
    makes sure). The launcher checks the width of the built model."""
    family = FAMILIES.get(hf.get("model_type"))
    if family is None or family.peers.get("torchtitan") != TORCHTITAN_MODEL:
        return f"torchtitan's llama3 model runs Llama configs, not model_type {hf.get('model_type')!r}"
    if hf.get("tie_word_embeddings"):
        return "torchtitan's Llama has no tied embeddings (set tie_word_embeddings=false)"
    dim, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    if hf.get("head_dim") not in (None, dim // heads):
        return f"torchtitan's head size is hidden_size / heads = {dim // heads}, this config has {hf['head_dim']}"
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        return "torchtitan's Llama has no biases"
    inter = int(hf["intermediate_size"])
    base = int(2 * 4 * dim / 3)
    scaling = hf.get("rope_scaling") or (hf.get("rope_parameters") or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("llama3", "default"):
        return f"torchtitan applies Llama 3 RoPE scaling only, this config has {rope_type!r}"
    theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    rope = ({"scaling_factor": float(scaling["factor"]), "low_freq_factor": float(scaling["low_freq_factor"]),
             "high_freq_factor": float(scaling["high_freq_factor"]),
             "original_max_position_embeddings": int(scaling["original_max_position_embeddings"])}
            if rope_type == "llama3" else
            # A factor of 1 leaves every frequency as it is: no scaling.
            {"scaling_factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192})
    return {"dim": dim, "n_layers": int(hf["num_hidden_layers"]), "n_heads": heads,
            "n_kv_heads": int(hf.get("num_key_value_heads") or heads), "vocab_size": int(hf["vocab_size"]),
            "multiple_of": inter, "ffn_dim_multiplier": None if base <= inter else inter / base,
            "norm_eps": float(hf.get("rms_norm_eps", 1e-5)), "rope_theta": float(theta),
            "rope_scaling_args": rope, "max_seq_len": max(seq_len, int(hf.get("max_position_embeddings", seq_len)))}


@dataclass(frozen=True)
class PeerJob:
    workdir: Path
    tokenizer_dir: Path
    dataset_dir: Path
    weights_dir: Path
    batch: int
    seq_len: int
    steps: int
    seed: int
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_steps: int
    max_norm: float
    mixed_precision: str = "bfloat16"
    compile: bool = True
    activation_checkpoint: str = "none"
    nproc: int = 1
    """Ranks (torchrun --nproc-per-node), all of them FSDP2 data-parallel shards."""


def job_config(job: PeerJob) -> dict[str, Any]:
    """The torchtitan job as TOML tables (written by `write_job`); `overrides` apply on top."""
    return {
        "job": {"dump_folder": str(job.workdir / "outputs"), "description": "kiln bench train-llm peer row"},
        "metrics": {"log_freq": 1, "enable_tensorboard": False, "disable_color_printing": True},
        "model": {"name": TORCHTITAN_MODEL, "flavor": FLAVOR, "hf_assets_path": str(job.tokenizer_dir)},
        "optimizer": {"name": "AdamW", "lr": job.lr, "beta1": job.betas[0], "beta2": job.betas[1], "eps": job.eps,
                      "weight_decay": job.weight_decay, "implementation": "fused"},
        # decay_ratio 0: linear warm-up, then the learning rate stays (no decay phase).
        "lr_scheduler": {"warmup_steps": job.warmup_steps, "decay_ratio": 0.0},
        "training": {"local_batch_size": job.batch, "seq_len": job.seq_len, "steps": job.steps,
                     "max_norm": job.max_norm, "dataset": "c4_test", "dataset_path": str(job.dataset_dir),
                     "mixed_precision_param": job.mixed_precision, "dtype": "float32"},
        "parallelism": {"data_parallel_shard_degree": job.nproc},
        "checkpoint": {"enable": True, "folder": "checkpoint", "initial_load_path": str(job.weights_dir),
                       "initial_load_in_hf": True, "initial_load_model_only": True, "load_only": True},
        # selective: torchtitan's per-op selective recompute ("op"), not every n-th block.
        "activation_checkpoint": {"mode": job.activation_checkpoint,
                                  **({"selective_ac_option": "op"} if job.activation_checkpoint == "selective" else {})},
        "compile": {"enable": job.compile, "components": ["model", "loss"]},
        "debug": {"seed": job.seed},
    }


def apply_overrides(tables: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`section.key=value` strings (nested: `quantize.linear.float8.recipe_name=rowwise`) onto the
    job; values are parsed as TOML values (numbers, booleans, lists), else taken as strings."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not sep or len(path) < 2 or not all(path):
            raise ValueError(f"torchtitan override {item!r}: expected section.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        table = tables
        for part in path[:-1]:
            table = table.setdefault(part, {})
        table[path[-1]] = value
    return tables


def write_job(path: Path, tables: dict[str, Any]) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(tables), encoding="utf-8")
    return path


def command(job_toml: Path, args_json: Path, workdir: Path, nproc: int = 1) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            str(launcher_path()), "--kiln-flavor", FLAVOR, "--kiln-model-args", str(args_json),
            "--kiln-first-batch", str(workdir / "first_batch.npy"), "--kiln-metrics", str(workdir / "metrics.jsonl"),
            "--kiln-info", str(workdir / "info.json"), "--job.config_file", str(job_toml)]


def rank_metrics_path(path: Path, rank: int) -> Path:
    """Rank r's metrics file: `path` itself for rank 0, `NAME.rankR.jsonl` beside it for the others."""
    return path if rank == 0 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b.*:")


def last_error(text: str) -> str:
    """The most telling line of a failed run's output: the last exception line of the child (the
    launcher's own ChildFailedError only says that the child failed)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if _ERROR_LINE.search(ln) and "ChildFailedError" not in ln]
    return (named or lines or ["no output"])[-1][:500]


def run(job: PeerJob, hf: dict[str, Any], overrides: list[str], timeout_s: float) -> dict[str, Any]:
    """Run torchtitan on the job; returns {status, reason, per_step: [...], info, config, log, wall_s}."""
    args = flavor_args(hf, job.seq_len)
    if isinstance(args, str):
        return {"status": "skipped", "reason": args}
    launcher = launcher_path()
    if not launcher.is_file():
        return {"status": "skipped", "reason": f"the launcher {launcher} is not in this checkout"}
    job.workdir.mkdir(parents=True, exist_ok=True)
    args_json = job.workdir / "model_args.json"
    args_json.write_text(json.dumps(args, indent=1), encoding="utf-8")
    tables = apply_overrides(job_config(job), overrides)
    job_toml = write_job(job.workdir / "job.toml", tables)
    cmd = command(job_toml, args_json, job.workdir, job.nproc)
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_CACHE=str(job.workdir / "hf_datasets_cache"))
    start = time.perf_counter()
    code, out, err = run_bounded(cmd, timeout_s, env=env, cwd=job.workdir)  # its ranks too, past the limit
    text = out + err
    wall = time.perf_counter() - start
    (job.workdir / "torchtitan.log").write_text(text, encoding="utf-8")
    info_path = job.workdir / "info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    per_step = read_metrics(job.workdir / "metrics.jsonl")
    ranks = [read_metrics(rank_metrics_path(job.workdir / "metrics.jsonl", r)) for r in range(job.nproc)]
    out: dict[str, Any] = {"per_step": per_step, "per_rank": ranks, "info": info, "wall_s": wall, "log": str(job.workdir / "torchtitan.log"),
                           "config": {"job": tables, "model_args": args, "command": cmd}}
    if code is None:
        out.update(status="error", reason=f"stopped after {timeout_s:.0f} s (its time limit)")
    elif code != 0:
        oom = "OutOfMemoryError" in text or "CUDA out of memory" in text
        out.update(status="oom" if oom else "error", reason=f"exit {code}: {last_error(text)}")
    elif len(per_step) < job.steps:
        out.update(status="error", reason=f"logged {len(per_step)} of {job.steps} steps")
    else:
        out.update(status="ok", reason=None)
    if info.get("ffn_hidden") not in (None, int(hf["intermediate_size"])):
        out.update(status="error", reason=f"torchtitan built an FFN of {info['ffn_hidden']}, the config has "
                                          f"{hf['intermediate_size']}")
    return out
