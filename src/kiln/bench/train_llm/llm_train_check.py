"""`kiln bench train-llm`'s check: the request (kiln.bench.train_llm.llm_train_request) becomes the
TrainLlmOptions the bench runs, or a ConfigError naming the flag (exit 2) before any work."""

from __future__ import annotations

import shlex
from pathlib import Path

import torch

from kiln.bench.compile.recipes import split_values
from kiln.bench.peers.plain.plain_loop import Hyper
from kiln.bench.peers.table import check_peers, peer, peer_names
from kiln.bench.train_llm.llm_train_bench import RowSpec, TrainLlmOptions
from kiln.bench.train_llm.llm_train_recipes import KILN_RECIPES
from kiln.bench.train_llm.llm_train_request import TrainLlmRequest
from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.llm.config import resolve_model
from kiln.runtime import resolve_device


def _positive(flag: str, value: float, minimum: float) -> None:
    if value < minimum:
        raise ConfigError(flag, f"must be >= {minimum:g}, got {value:g}")


def _check_ranks(nproc: int, device) -> None:
    """One GPU per rank: more ranks than visible GPUs would share one."""
    if nproc > 1 and device.type == "cuda":
        if nproc > torch.cuda.device_count():
            raise ConfigError("--nproc-per-node", f"{nproc} ranks but {torch.cuda.device_count()} visible GPUs")


def parse_recipe(text: str) -> tuple[str, list[str]]:
    """'NAME: KEY=VALUE KEY=VALUE' -> (name, overrides)."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not name or any(c in name for c in " ,="):
        raise ConfigError("--recipe", f"expected 'NAME: KEY=VALUE ...', got {text!r}")
    overrides = shlex.split(rest)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError("--recipe", f"{name}: {bad[0]!r} is not KEY=VALUE")
    return name, overrides


def parse_peer_recipe(text: str, peers: tuple[str, ...]) -> tuple[str, str, list[str]]:
    """'NAME: PEER KEY=VALUE ...' -> (name, peer, overrides); the peer must take settings of its own
    (kiln.bench.peers.interface.Peer.row_settings), checked by its `check`."""
    name, sep, rest = text.partition(":")
    name, words = name.strip(), shlex.split(rest)
    if not sep or not name or any(c in name for c in " ,=") or not words:
        raise ConfigError("--peer-recipe", f"expected 'NAME: PEER KEY=VALUE ...', got {text!r}")
    kind, overrides = words[0], words[1:]
    if kind not in peers:
        raise ConfigError("--peer-recipe", f"{name}: unknown peer {kind!r}", peers)
    takes = peer("train-llm", kind).row_settings
    if takes is None:
        raise ConfigError("--peer-recipe", f"{name}: {kind} takes no settings of its own",
                          tuple(p for p in peers if peer("train-llm", p).row_settings))
    if not overrides:
        raise ConfigError("--peer-recipe", f"{name}: no settings after {kind!r} (expected {takes})")
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError("--peer-recipe", f"{name}: {bad[0]!r} is not KEY=VALUE (expected {takes})")
    return name, kind, overrides


def check_train_llm(req: TrainLlmRequest) -> TrainLlmOptions:
    """TrainLlmOptions from the request; ConfigError on any bad input."""
    lr_warmup = req.lr_warmup if req.lr_warmup is not None else max(1, req.steps // 2)
    for flag, value, minimum in (("--seq-len", req.seq_len, 1), ("--batch-size", req.batch_size, 1),
                                 ("--nproc-per-node", req.nproc_per_node, 1),
                                 ("--warmup", req.warmup, 0), ("--lr-warmup", lr_warmup, 0)):
        _positive(flag, value, minimum)
    _positive("--steps", req.steps, req.warmup + 2)
    _positive("--steps", req.steps, lr_warmup)
    if not req.lr > 0:
        raise ConfigError("--lr", f"must be > 0, got {req.lr}")
    source = resolve_model(req.model)
    hf = dict(source.raw)
    limit = int(hf.get("max_position_embeddings") or 0)
    if limit and req.seq_len > limit:
        raise ConfigError("--seq-len", f"{req.seq_len} is past the model's {limit} positions")
    peers = peer_names("train-llm")
    recipes = dict(KILN_RECIPES)
    for text in req.recipe:
        name, overrides = parse_recipe(text)
        if name in peers:
            raise ConfigError("--recipe", f"{name!r} names a peer row; choose another name")
        recipes[name] = overrides
    peer_rows: dict[str, tuple[str, list[str]]] = {}
    for text in req.peer_recipe:
        name, kind, overrides = parse_peer_recipe(text, peers)
        if name in peers or name in recipes or name in peer_rows:
            raise ConfigError("--peer-recipe", f"{name!r} names another row; choose another name")
        peer_rows[name] = (kind, overrides)
    names = split_values(req.rows) if req.rows else [
        "plain", "kiln", *(parse_recipe(t)[0] for t in req.recipe), "torchtitan", *peer_rows]
    valid = (*peers, *recipes, *peer_rows)
    for name in names:
        if name not in valid:
            raise ConfigError("--rows", f"unknown row {name!r}", valid)
    if req.baseline is not None and req.baseline not in names:
        raise ConfigError("--baseline", f"{req.baseline!r} is not one of the rows", tuple(names))
    device = resolve_device(req.device)
    _check_ranks(req.nproc_per_node, device)
    titan = any(n == "torchtitan" or peer_rows.get(n, ("",))[0] == "torchtitan" for n in names)
    if titan and (req.untie or hf.get("tie_word_embeddings")):
        hf["tie_word_embeddings"] = False
    elif req.untie:
        hf["tie_word_embeddings"] = False
    rows = []
    for name in names:
        if name in peers:
            rows.append(RowSpec(name, name))
            continue
        if name in peer_rows:
            rows.append(RowSpec(name, peer_rows[name][0], tuple(peer_rows[name][1])))
            continue
        overrides = tuple(recipes[name])
        invalid = None
        try:  # the recipe on the base config, checked as kiln train would check it
            load_config(None, ["data.source=synthetic", f"data.seq_len={req.seq_len}", f"training.steps={req.steps}",
                               f"optim.warmup_steps={lr_warmup}", *overrides])
        except ConfigError as exc:
            if not req.skip_invalid_recipes:
                raise ConfigError("--recipe", f"{name}: {exc}") from None
            invalid = f"kiln's config refused the recipe: {exc}"
        rows.append(RowSpec(name, "kiln", overrides, invalid))
    hyper = Hyper(lr=req.lr, warmup_steps=lr_warmup)
    notes = []
    if hf.get("tie_word_embeddings") is False and source.raw.get("tie_word_embeddings"):
        notes.append("every row trains the untied shape (a separate LM head): torchtitan's Llama cannot tie "
                     "embeddings; model FLOPs per token are the same either way")
    opts = TrainLlmOptions(model=req.model, hf=hf, seq_len=req.seq_len, batch=req.batch_size, steps=req.steps,
                           warmup=req.warmup, rows=rows, hyper=hyper, precision=req.precision, seed=req.seed,
                           device=str(device), kiln_family=req.kiln_family,
                           data_dir=Path(req.data_dir) if req.data_dir else None, deadline_s=req.deadline_s,
                           torchtitan_overrides=list(req.torchtitan_set),
                           torchtitan_timeout_s=req.torchtitan_timeout_s, loss_tol=req.loss_tol,
                           baseline=req.baseline, plain_compile=not req.no_plain_compile, nproc=req.nproc_per_node,
                           plain_ac=req.plain_ac, row_timeout_s=req.row_timeout_s, notes=notes)
    check_peers("train-llm", opts)  # each peer's own flags (--torchtitan-set)
    return opts
