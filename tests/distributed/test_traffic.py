"""The collectives kiln.distributed.traffic predicts are the ones the wrappers really issue: DDP's
buckets after its rebuild, FSDP2's units (grouped blocks, the last one kept gathered), checked
against real wrappers on two gloo ranks; and the byte counts of both strategies."""

from __future__ import annotations

from pathlib import Path

import pytest
from traffic_worker import OVERRIDES  # tests/distributed is on sys.path (conftest.py)

from kiln.config import load_config
from kiln.distributed.fsdp import UNIT_TARGET_BYTES, fsdp_units
from kiln.distributed.traffic import step_traffic
from kiln.models import build_model

HERE = Path(__file__).parent
VIT_B16 = HERE.parents[1] / "configs" / "vit_b16.toml"


@pytest.fixture(scope="module")
def wrappers(run_ranks, tmp_path_factory):
    return run_ranks("traffic_worker.py", tmp_path_factory.mktemp("traffic") / "report.json")


def test_ddp_buckets_match_ddps_own(wrappers):
    t = step_traffic(load_config(None, OVERRIDES), "ddp")
    assert [c.nbytes for c in t.collectives] == wrappers["ddp_buckets"]
    assert all(c.op == "all_reduce" and c.phase == "backward" for c in t.collectives)


def test_fsdp_units_match_fully_shard(wrappers):
    cfg = load_config(None, [*OVERRIDES, "distributed.fsdp_unit_blocks=2"])
    t = step_traffic(cfg, "fsdp")
    gathers = [c for c in t.collectives if c.op == "all_gather" and c.phase == "forward" and c.label != "root"]
    assert [c.nbytes // 4 for c in gathers] == [u["params"] for u in wrappers["fsdp_units"]]  # fp32 policy: 4 B
    # Every unit but the last is resharded after forward, so only those gather again in backward.
    assert [u["reshard"] for u in wrappers["fsdp_units"]] == [True, True, False]
    assert [u["prefetches"] for u in wrappers["fsdp_units"]] == [1, 1, 0]  # fsdp_forward_prefetch=1
    regathers = [c.label for c in t.collectives if c.op == "all_gather" and c.phase == "backward"]
    assert regathers == ["unit 2/3", "unit 1/3"]
    assert wrappers["state_dict_keys_kept"]


def test_byte_counts_follow_dtypes_and_hooks():
    vit = ["model.name=vit", "model.kwargs.depth=4", "model.kwargs.embed_dim=64", "model.kwargs.num_heads=2",
           "model.kwargs.img_size=32", "model.kwargs.patch_size=8", "precision.policy=bf16-mixed"]
    cfg = load_config(None, vit)
    n = sum(p.numel() for p in build_model(cfg.model).module.parameters())
    ddp = step_traffic(cfg, "ddp")
    assert ddp.bytes_of("all_reduce") == 4 * n  # bf16-mixed keeps fp32 gradients
    assert step_traffic(load_config(None, [*vit, "distributed.ddp_comm_hook=bf16"]), "ddp").bytes_of("all_reduce") == 2 * n
    fsdp = step_traffic(cfg, "fsdp")
    forward = sum(c.nbytes for c in fsdp.collectives if c.op == "all_gather" and c.phase == "forward")
    assert forward == 2 * n  # parameters gathered in bf16
    assert fsdp.bytes_of("reduce_scatter") == 4 * n  # reduced in fp32 by default
    half = step_traffic(load_config(None, [*vit, "distributed.fsdp_reduce_dtype=bf16"]), "fsdp")
    assert half.bytes_of("reduce_scatter") == 2 * n
    kept = step_traffic(load_config(None, [*vit, "distributed.fsdp_reshard_after_forward=false"]), "fsdp")
    assert kept.bytes_of("all_gather") == 2 * n
    assert sum(c.share for c in fsdp.collectives if c.op == "reduce_scatter") == pytest.approx(1.0)


def test_auto_units_reach_the_target_size():
    import torch

    cfg = load_config(VIT_B16, [])
    with torch.device("meta"):
        built = build_model(cfg.model)
    units = fsdp_units(built.module, built.blocks, cfg.distributed, param_bytes=2)
    block_bytes = 2 * sum(p.numel() for p in built.blocks[0].parameters())
    per_unit = len(units[0])
    assert per_unit * block_bytes >= UNIT_TARGET_BYTES > (per_unit - 1) * block_bytes
    assert sum(len(u) if isinstance(u, list) else 1 for u in units) == len(built.blocks)
    one = load_config(VIT_B16, ["distributed.fsdp_unit_blocks=1"]).distributed
    assert fsdp_units(built.module, built.blocks, one) == list(built.blocks)
