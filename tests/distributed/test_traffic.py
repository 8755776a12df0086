"""The collectives kiln.distributed.traffic predicts are the ones the wrappers really issue: DDP's
buckets after its rebuild, FSDP2's units (grouped blocks, balanced; the last one kept gathered,
small models kept gathered whole), checked against real wrappers on two gloo ranks; and the byte
counts of both strategies."""

from __future__ import annotations

from pathlib import Path

import pytest
from traffic_worker import OVERRIDES  # tests/distributed is on sys.path (conftest.py)

from kiln.config import load_config
from kiln.distributed.fsdp import KEEP_GATHERED_BYTES, UNIT_TARGET_BYTES, fsdp_units, reshards_after_forward
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
    cfg = load_config(None, [*OVERRIDES, "distributed.fsdp_unit_blocks=2", "distributed.fsdp_reshard_after_forward=true"])
    t = step_traffic(cfg, "fsdp")
    gathers = [c for c in t.collectives if c.op == "all_gather" and c.phase == "forward" and c.label != "root"]
    assert [c.nbytes // 4 for c in gathers] == [u["params"] for u in wrappers["fsdp_units"]]  # fp32 policy: 4 B
    # Every unit but the last is resharded after forward, so only those gather again in backward.
    assert [u["reshard"] for u in wrappers["fsdp_units"]] == [True, True, False]
    assert [u["prefetches"] for u in wrappers["fsdp_units"]] == [1, 1, 0]  # fsdp_forward_prefetch=1
    assert [u["backward_prefetches"] for u in wrappers["fsdp_units"]] == [0, 1, 2]  # fsdp_backward_prefetch=2
    regathers = [c.label for c in t.collectives if c.op == "all_gather" and c.phase == "backward"]
    assert regathers == ["unit 2/3", "unit 1/3"]
    assert wrappers["state_dict_keys_kept"]


def test_small_models_stay_gathered_by_default(wrappers):
    # `auto` (the default) on a model that gathers far less than KEEP_GATHERED_BYTES: no unit is
    # resharded after forward, on the real wrappers and in the predicted traffic alike.
    assert [u["reshard"] for u in wrappers["fsdp_units_auto"]] == [False, False, False]
    t = step_traffic(load_config(None, [*OVERRIDES, "distributed.fsdp_unit_blocks=2"]), "fsdp")
    assert not [c for c in t.collectives if c.op == "all_gather" and c.phase == "backward"]


def test_a_memory_plans_decision_overrides_the_rule_and_ranks_agree(wrappers):
    # The same small model, `auto`: resharded when the plan says so (every unit but the last), and
    # when only one rank's plan says so (FSDP2 units resharded on one rank only would hang backward).
    assert [u["reshard"] for u in wrappers["fsdp_units_planned"]] == [True, True, False]
    assert [u["reshard"] for u in wrappers["fsdp_units_disagreeing"]] == [True, True, False]


def test_reshard_rule_follows_the_gathered_size():
    auto = load_config(None, []).distributed
    assert auto.fsdp_reshard_after_forward is None  # auto
    assert not reshards_after_forward(auto, KEEP_GATHERED_BYTES)
    assert reshards_after_forward(auto, KEEP_GATHERED_BYTES + 1)
    for value, expected in (("true", True), ("false", False)):
        cfg = load_config(None, [f"distributed.fsdp_reshard_after_forward={value}"]).distributed
        assert reshards_after_forward(cfg, 0) is expected and reshards_after_forward(cfg, 2**40) is expected
    # A ViT-B/16 (172 MB in bf16) stays gathered; a 0.74 B-parameter ViT (1.5 GB) is resharded, all
    # units but the last gathering again in backward.
    assert not [c for c in step_traffic(load_config(VIT_B16, []), "fsdp").collectives
                if c.op == "all_gather" and c.phase == "backward"]
    big = step_traffic(load_config(VIT_B16, ["model.kwargs.embed_dim=1600", "model.kwargs.depth=24",
                                             "model.kwargs.num_heads=16"]), "fsdp")
    units = [c.label for c in big.collectives if c.op == "reduce_scatter" and c.label != "root"]
    regathers = [c.label for c in big.collectives if c.op == "all_gather" and c.phase == "backward"]
    assert len(units) > 2 and sorted(regathers) == sorted(units[1:])  # units[0] is the last unit (backward order)


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


def test_auto_units_reach_the_target_size_and_are_balanced():
    import torch

    cfg = load_config(VIT_B16, [])
    with torch.device("meta"):
        built = build_model(cfg.model)
    units = fsdp_units(built.module, built.blocks, cfg.distributed, param_bytes=2)
    block_bytes = 2 * sum(p.numel() for p in built.blocks[0].parameters())
    fewest = -(-UNIT_TARGET_BYTES // block_bytes)  # blocks that reach the target
    # As many units as hold >= `fewest` blocks each, the 12 blocks spread evenly: ViT-B/16 in bf16
    # (14.2 MB a block, 5 reach 64 MiB) gets 6 + 6, not 5 + 5 + 2.
    assert [len(u) for u in units] == [6, 6] and fewest == 5
    assert all(len(u) * block_bytes >= UNIT_TARGET_BYTES for u in units)
    assert [b for u in units for b in u] == list(built.blocks)  # consecutive, in order, each once
    one = load_config(VIT_B16, ["distributed.fsdp_unit_blocks=1"]).distributed
    assert fsdp_units(built.module, built.blocks, one) == list(built.blocks)
    # A configured count is taken as is, the remainder in the last unit.
    five = load_config(VIT_B16, ["distributed.fsdp_unit_blocks=5"]).distributed
    assert [len(u) for u in fsdp_units(built.module, built.blocks, five)] == [5, 5, 2]
    # Seven blocks of which five reach the target: one unit of all seven. No blocks: no units.
    assert [len(u) for u in fsdp_units(built.module, built.blocks[:7], cfg.distributed, param_bytes=2)] == [7]
    assert fsdp_units(built.module, [], cfg.distributed, param_bytes=2) == []
