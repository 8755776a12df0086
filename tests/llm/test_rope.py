"""kiln.llm.rope: a compiled training step computes cos/sin once, through the opaque
`kiln::rope_cos_sin` op, and its backward reads them instead of recomputing sin and cos per element;
eager and inference calls compute them inline, with the same values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from functorch.compile import min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd

from kiln.llm import random_decoder
from kiln.llm.config import config_from_dict, preset_config
from kiln.llm.rope import Rotary, rope_cos_sin


def _targets(graph: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}


def test_op_equals_the_inline_computation():
    rotary = Rotary(config_from_dict(preset_config("llama-tiny")).rope, 16)
    positions = torch.arange(7).view(1, 7).expand(2, 7) + torch.tensor([[0], [3]])
    cos, sin = rope_cos_sin(positions, rotary.inv_freq, torch.bfloat16)
    want = rotary(positions, torch.bfloat16)
    assert cos.shape == (2, 7, 1, 16) and cos.equal(want[0]) and sin.equal(want[1])


def test_compiled_training_saves_cos_sin_for_the_backward():
    torch._dynamo.reset()
    model = random_decoder(config_from_dict(preset_config("llama-tiny")), device="cpu", dtype=torch.float32)
    model.requires_grad_(True)
    graphs: dict[str, list[torch.fx.GraphModule]] = {"fw": [], "bw": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return gm.forward
        return compiler

    # inductor's partitioner (min-cut rematerialisation), recording the graphs instead of compiling
    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                           partition_fn=min_cut_rematerialization_partition)
    tokens = torch.randint(0, 100, (2, 9))
    loss_fn = torch.compile(lambda: F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()),
                            backend=backend)
    loss_fn().backward()
    fw, bw = graphs["fw"], graphs["bw"]
    assert len(fw) == 1 and len(bw) == 1
    assert "kiln.rope_cos_sin.default" in _targets(fw[0])
    forbidden = {"aten.cos.default", "aten.sin.default", "kiln.rope_cos_sin.default"}
    assert not forbidden & (_targets(fw[0]) - {"kiln.rope_cos_sin.default"})
    assert not forbidden & _targets(bw[0])  # read from the forward, not recomputed


def test_inference_keeps_the_inline_computation():
    torch._dynamo.reset()
    rotary = Rotary(config_from_dict(preset_config("llama-tiny")).rope, 16)
    seen: list[set[str]] = []

    def backend(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    positions = torch.arange(5).view(1, 5)
    with torch.no_grad():
        got = torch.compile(lambda p: rotary(p, torch.float32), backend=backend)(positions)
    assert seen and not any("rope_cos_sin" in t for t in seen[0])
    assert got[0].equal(rotary(positions, torch.float32)[0])
