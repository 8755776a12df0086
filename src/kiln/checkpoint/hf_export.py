"""A run's model as a Hugging Face directory: config.json, model.safetensors, generation_config.json
and the tokenizer files, loadable by `transformers.AutoModelForCausalLM.from_pretrained` and by
`kiln generate --model DIR`.

At the start of training the trainer saves what the checkpoint lacks (`save_run_files`): the
resolved config.toml and, into RUN_DIR/model/, the model's config.json fields and, when the token
file the run reads (`data.path`) has a `meta.json` beside it naming a tokenizer directory, that
tokenizer's files, so the run dir alone is enough to export later. `export_hf_dir` then takes the weights of a
checkpoint (FSDP shards gathered, see kiln.checkpoint.export), renames kiln's fused decoder
tensors to HF's (its family's name map, kiln.llm.weights.to_hf_state_dict; `hf:` runs already
use HF's names) and writes the directory under a temporary name, renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from kiln.checkpoint.export import readable_weights
from kiln.checkpoint.export_target import check_export_target
from kiln.checkpoint.layout import read_marker
from kiln.config.load import save_config
from kiln.config.schema import Config
from kiln.data.prepared import META_FILE
from kiln.data.special_tokens import align_config
from kiln.data.tokenizers_io import copy_tokenizer_dir
from kiln.errors import ConfigError
from kiln.llm.weights import kiln_layout, to_hf_state_dict
from kiln.safe_io import read_json, write_atomic, write_json

MODEL_DIR = "model"
"""Under the run dir: the model's config.json and the tokenizer files of its data."""
# A path ending like a single weights file is a mistake for a directory.
FILE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def tokenizer_dir_of(token_path: str | Path) -> Path | None:
    """The tokenizer directory prepared token data names: `meta.json` beside the token file (or in
    the prepared directory `data.path` names) with a key "tokenizer" (a directory relative to
    meta.json). None when there is none."""
    if not token_path:
        return None
    path = Path(token_path)
    meta = (path if path.is_dir() else path.parent) / META_FILE
    try:
        name = read_json(meta, 16 << 20, follow=True).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(name, str) or not name:
        return None
    directory = meta.parent / name
    return directory if directory.is_dir() else None


def save_run_files(run_dir: Path, cfg: Config, hf_config: dict[str, Any] | None, tokenizer: Path | None) -> None:
    """RUN_DIR/config.toml (the resolved config) and, for a model with an HF config, what `kiln export
    --out DIR` needs besides the weights: RUN_DIR/model/config.json and the data's tokenizer files
    (`tokenizer`, the directory `tokenizer_dir_of` names) beside it."""
    save_config(cfg, run_dir / "config.toml")
    if hf_config is None:
        return
    target = Path(run_dir) / MODEL_DIR
    target.mkdir(parents=True, exist_ok=True)
    write_atomic(target / "config.json", json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        copy_tokenizer_dir(tokenizer, target)


def _generation_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """BOS/EOS/pad ids for generation_config.json, when the config names them (the tokenizer's, see
    kiln.data.special_tokens)."""
    fields = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    return fields or None


def _hf_tensors(tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """HF-named tensors: kiln's decoder layout converted by its family's name map, an HF model's
    state dict as it is (less a tied output head, which transformers re-ties on load)."""
    decoder = kiln_layout(tensors, config)
    if decoder is not None:
        return to_hf_state_dict(tensors, decoder)
    if config.get("tie_word_embeddings") and "lm_head.weight" in tensors:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    return tensors


def _with_dtype(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """config.json fields naming the dtype the weights are stored in (the checkpoint's: fp32 masters
    stay fp32), so transformers' `dtype="auto"` loads them as saved; `use_cache` on for generation."""
    config = {**config}
    config.setdefault("use_cache", True)
    dtypes = {v.dtype for v in tensors.values() if v.is_floating_point()}
    name = _DTYPE_NAMES.get(next(iter(dtypes))) if len(dtypes) == 1 else None
    if name:
        config["torch_dtype"] = name
        config.pop("dtype", None)
    return config


def _swap_in(part: Path, out: Path) -> str:
    """Put the complete export `part` at `out` in place of the earlier export there (checked by
    check_export_target); returns what was done, for the report. A failure says where the earlier
    export is."""
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.replace(out, old / out.name)
    try:
        os.replace(part, out)
    except OSError as exc:
        raise OSError(exc.errno, f"could not move the new export into place ({exc.strerror}); the earlier "
                      f"export is kept at {old / out.name}", str(out)) from exc
    shutil.rmtree(old)
    return f"the earlier export at {out} was replaced (removed)"


def export_hf_dir(run_dir: Path, out: Path, *, checkpoint: Path | None = None, replace: bool = False) -> dict[str, Any]:
    """Write RUN_DIR's newest complete checkpoint (or `checkpoint`) as an HF model directory `out`.
    An existing `out` is refused, or with `replace`, when it is an earlier kiln export, swapped out
    only once the new one is complete (kiln.checkpoint.export_target)."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConfigError("kiln export", "needs safetensors: pip install 'kiln[llm]' (or safetensors)") from None
    run_dir, out = Path(run_dir), Path(os.path.abspath(out))
    if out.suffix in FILE_SUFFIXES:
        raise ConfigError("--out", f"{out}: must end in .safetensors (one file) or name a directory (a Hugging "
                          "Face model directory)")
    check_export_target(run_dir, out, checkpoint=checkpoint, force=replace)
    files = run_dir / MODEL_DIR
    if not run_dir.is_dir():
        raise ConfigError("RUN_DIR", f"{run_dir}: does not exist (a run directory that kiln train wrote: "
                          "--run-dir, or the runs/<time>-... it printed)")
    if not (run_dir / "checkpoints").is_dir() and checkpoint is None:
        raise ConfigError("RUN_DIR", f"{run_dir}: not a kiln run directory (no checkpoints/ in it): name the run "
                          "dir kiln train wrote, or a checkpoint with --checkpoint")
    if not (files / "config.json").is_file():
        raise ConfigError("RUN_DIR", f"{run_dir}: has no {MODEL_DIR}/config.json (only runs of llama: and hf: "
                          "causal LMs record one); export the weights alone with --out FILE.safetensors")
    try:
        raw = read_json(files / "config.json", 16 << 20)
    except (OSError, ValueError) as exc:
        raise ConfigError("RUN_DIR", f"{files / 'config.json'}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError("RUN_DIR", f"{files / 'config.json'}: not a JSON object")
    # The tokenizer's BOS/EOS/pad ids win over the config's: the model learned the data's (a run of
    # an older kiln recorded its preset's, at which generation would stop mid-text).
    raw, special_changes = align_config(raw, files)
    path, weights = readable_weights(run_dir, checkpoint)
    tensors, seen = {}, set()
    for key, value in _hf_tensors(weights, raw).items():
        if value.untyped_storage().data_ptr() in seen or not value.is_contiguous():
            value = value.contiguous().clone()  # safetensors stores no shared or strided views
        seen.add(value.untyped_storage().data_ptr())
        tensors[key] = value
    config = _with_dtype(raw, tensors)
    part = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))  # new: nothing planted
    replaced = None
    try:
        save_file(tensors, str(part / "model.safetensors"), metadata={"format": "pt", "kiln_checkpoint": str(path)})
        write_atomic(part / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
        generation = _generation_config(config)
        if generation is not None:
            write_json(part / "generation_config.json", generation)
        extra_files = copy_tokenizer_dir(files, part)  # the tokenizer's files, never weights
        if out.exists():  # replace: the old export leaves only now, by renames on one filesystem
            replaced = _swap_in(part, out)
        else:
            os.replace(part, out)  # a reader never sees half a directory
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)  # ours: created above
        raise
    marker = read_marker(path) or {}
    return {"checkpoint": str(path), "step": marker.get("step"), "out": str(out), "format": "hf", "replaced": replaced,
            "tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values()),
            "tokenizer_files": extra_files, "bytes": (out / "model.safetensors").stat().st_size,
            "special_tokens": {k: {"config": old, "tokenizer": new} for k, (old, new) in special_changes.items()}}
