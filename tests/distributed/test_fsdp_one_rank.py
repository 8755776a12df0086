"""kiln.distributed.fsdp_one_rank: at world size 1, kiln's fused copy into the gathered parameters
trains exactly as torch's per-parameter copy does (losses and final parameters bit for bit, fp32 and
bf16 param dtype, units resharded after forward or kept, with and without gradient accumulation),
and it stays off, saying why once, where torch's code is not the one it replaces."""

from __future__ import annotations

import logging

import pytest
import torch

import kiln.distributed.fsdp_one_rank as one_rank

CASES = [f"{precision}/reshard={reshard}/accum={accum}" for precision in ("fp32", "bf16-mixed")
         for reshard in ("true", "false") for accum in (1, 2)]


@pytest.fixture(scope="module")
def report(run_ranks, tmp_path_factory):
    return run_ranks("one_rank_unshard_worker.py", tmp_path_factory.mktemp("one_rank") / "report.json", nproc=1)


@pytest.mark.parametrize("case", CASES)
def test_fused_copy_trains_exactly_as_torchs_copy(report, case):
    assert report["world_size"] == 1
    torch_run, kiln_run = report[case]["torch"], report[case]["kiln"]
    # Each run took the code it names, and only that code.
    assert torch_run["layout"]["one_rank_fused_copy"] is False and kiln_run["layout"]["one_rank_fused_copy"] is True
    assert torch_run["calls"]["kiln"] == 0 and torch_run["calls"]["torch"] > 0
    assert kiln_run["calls"]["torch"] == 0 and kiln_run["calls"]["kiln"] == torch_run["calls"]["torch"]
    expected = ["torch.bfloat16"] if case.startswith("bf16") else ["torch.float32"]
    assert torch_run["gathered_dtypes"] == kiln_run["gathered_dtypes"] == expected
    assert kiln_run["losses"] == torch_run["losses"]  # bit for bit (floats through JSON round-trip exactly)
    assert kiln_run["params"] == torch_run["params"]
    assert torch_run["losses"][-1] != torch_run["losses"][0]  # it did train


def test_this_torch_has_the_code_it_replaces():
    # CI pins torch (constraints/cpu.txt); on a torch that rewrote FSDP2's one-rank branch this
    # fails on purpose: read the new branch, then adjust fsdp_one_rank or let it stay off.
    assert one_rank.torch_problem() is None


def test_a_rewritten_torch_branch_turns_it_off(monkeypatch):
    monkeypatch.setattr(one_rank.inspect, "getsource", lambda fn: "def wait_for_unshard(self):\n    pass\n")
    reason = one_rank.torch_problem.__wrapped__()
    assert "no longer has the per-parameter copy" in reason


def test_off_is_logged_once(monkeypatch, caplog):
    reason = "a reason only this test gives"
    monkeypatch.setattr(one_rank, "torch_problem", lambda: reason)
    with caplog.at_level(logging.INFO, logger="kiln.distributed"):
        assert one_rank.install_one_rank_unshard(torch.nn.Linear(2, 2)) == 0
        assert one_rank.install_one_rank_unshard(torch.nn.Linear(2, 2)) == 0
    assert [r.getMessage().count(reason) for r in caplog.records] == [1]
