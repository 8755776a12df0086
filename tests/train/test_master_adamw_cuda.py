"""kiln.kernels.master_kernel compiled for a CUDA GPU (run on the device machine; skipped in CPU CI,
where tests/train/test_master_adamw.py runs the same kernel under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from kiln.train.master_adamw import MasterAdamW

from .test_master_adamw import HYPER, _bf16_model, _groups, _random_grads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled kernel)")
def test_cuda_kernel_matches_the_reference_over_steps():
    model = _bf16_model()
    ref_model = _bf16_model()
    cuda_params = [p.detach().cuda().requires_grad_(True) for p in model.parameters()]
    ref_params = list(ref_model.parameters())
    ours = MasterAdamW(_groups(cuda_params), **HYPER)
    ref = MasterAdamW(_groups(ref_params), use_kernel=False, **HYPER)
    for step in range(4):
        for p, q, g in zip(cuda_params, ref_params, _random_grads(ref_params, step)):
            p.grad, q.grad = g.cuda(), g
        ours.clip_coef, ref.clip_coef = torch.tensor(0.5, device="cuda"), torch.tensor(0.5)
        ours.step()
        ref.step()
    for p, q in zip(cuda_params, ref_params):
        torch.testing.assert_close(ours.state[p]["master"].cpu(), ref.state[q]["master"], rtol=1e-5, atol=1e-6)
        assert (p.detach().cpu().float() - q.float()).abs().max() <= q.float().abs().max() * 2**-7
