"""Channels-last memory format for convolutional networks.

cuDNN's tensor-core convolutions and oneDNN's CPU convolutions work in NHWC; an NCHW model pays a
layout transform around each convolution (PyTorch tutorial "Channels Last Memory Format").
Converting the model's weights is enough: a convolution whose weight is channels-last returns a
channels-last output, so the format propagates through the network from the first convolution on.
The check times the model's forward + backward as is and converted, interleaved, under the run's
precision, on copies (the caller's model is not touched).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kiln.advise.findings import Finding, saved
from kiln.timing import measure_interleaved

FIX = ("convert the model in your factory: `model = model.to(memory_format=torch.channels_last)` (inputs may stay "
       "NCHW: the first convolution switches the format)")


def _fwd_bwd(model: nn.Module, inputs: tuple[Any, ...], context: Callable[[], Any]) -> Callable[[], None]:
    def step() -> None:
        with context():
            out = model(*inputs)
        out = out if isinstance(out, torch.Tensor) else out[0]
        out.float().sum().backward()
        model.zero_grad(set_to_none=True)

    return step


def check_channels_last(module: nn.Module, inputs: tuple[Any, ...], *, device: torch.device, measure: bool,
                        context: Callable[[], Any]) -> Finding:
    title = "channels-last for convolutions"
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    four_d = any(isinstance(x, torch.Tensor) and x.dim() == 4 for x in inputs)
    if not convs or not four_d:
        return Finding("channels_last", title, "n/a", "no 2-d convolutions on 4-d inputs: the memory format does not matter")
    already = all(c.weight.is_contiguous(memory_format=torch.channels_last) and not c.weight.is_contiguous()
                  for c in convs)
    if already:
        return Finding("channels_last", title, "ok", f"the {len(convs)} convolutions are channels-last already")
    finding = f"{len(convs)} Conv2d layers run in NCHW (contiguous) format"
    if not measure:
        return Finding("channels_last", title, "advice", finding, FIX)
    nchw = copy.deepcopy(module).to(device).train()
    nhwc = copy.deepcopy(module).to(device).train().to(memory_format=torch.channels_last)
    timings = measure_interleaved({"nchw": _fwd_bwd(nchw, inputs, context), "nhwc": _fwd_bwd(nhwc, inputs, context)},
                                  warmup=3, repeats=20, device=device)
    before, after = timings["nchw"].median_s, timings["nhwc"].median_s
    gain, frac = saved(before, after)
    measured = {"nchw_ms": before * 1e3, "channels_last_ms": after * 1e3, "what": "model forward + backward"}
    if frac > 0.02:
        return Finding("channels_last", title, "advice", finding, FIX, gain, frac, measured)
    return Finding("channels_last", title, "info", finding + f"; channels-last measured no faster on {device.type}",
                   "keep NCHW here (re-check on the GPU you train on)", gain, frac, measured)
