"""Planted problems for the diagnose tests: one factory per graph-break category, recompile cause and
backend failure. Each problem line carries a `# planted: <tag>` marker; tests find its line number
by the marker, so editing this file does not break them.

Every factory returns (module, example_inputs), the `kiln explain` TARGET form.
"""

from __future__ import annotations

import logging
import zlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

log = logging.getLogger("kiln.tests.planted")


class _Net(nn.Module):
    """A Linear, then the planted construct in `problem`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.problem(self.fc(x))

    def problem(self, y):
        return y


def _example(batch: int = 4) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(batch, 8)


class Branch(_Net):
    def problem(self, y):
        if y.sum() > 0:  # planted: branch
            return y + 1
        return y - 1


class Item(_Net):
    def problem(self, y):
        s = y.sum().item()  # planted: item
        return y * s


class Print(_Net):
    def problem(self, y):
        print("planted print", y.shape)  # planted: print
        return y + 1


class Logging(_Net):
    def problem(self, y):
        log.warning("planted log %s", 1)  # planted: logging
        return y + 1


class Builtin(_Net):
    def problem(self, y):
        checksum = zlib.crc32(b"kiln")  # planted: builtin
        return y + checksum % 7


class Numpy(_Net):
    def problem(self, y):
        bits = np.packbits(np.array([1, 0, 1], dtype=np.uint8))  # planted: numpy
        return y + int(bits[0])


class Collective(_Net):
    def problem(self, y):
        work = dist.all_reduce(y, async_op=True)  # planted: collective
        work.wait()
        return y + 1


class DynamicShape(_Net):
    def problem(self, y):
        idx = torch.nonzero(y > 0)  # planted: dynamic
        return y + idx.shape[0]


class LoopPrint(_Net):
    def problem(self, y):
        for i in range(2):
            y = y + i
            print("step", i)  # planted: loop
        return y


class Scaled(_Net):
    def forward(self, x, scale: float):
        return self.fc(x) * scale  # planted: float


class Repeated(_Net):
    def forward(self, x, times: int):
        for _ in range(times):  # planted: unrolled
            x = torch.tanh(x)
        return self.fc(x)


def branch():
    return Branch(), _example()


def item():
    return Item(), _example()


def printer():
    return Print(), _example()


def logging_call():
    return Logging(), _example()


def builtin():
    return Builtin(), _example()


def numpy_call():
    return Numpy(), _example()


def collective():
    return Collective(), _example()


def dynamic_shape():
    return DynamicShape(), _example()


def loop_print():
    return LoopPrint(), _example()


def float_arg():
    """A Python float argument: changing it recompiles."""
    return Scaled(), (_example(), 0.5)


def repeated():
    """A Python int that sets a loop count: the loop unrolls, so every new value recompiles."""
    return Repeated(), (_example(), 2)


def clean():
    """No problem at all: one graph, fullgraph works."""
    return _Net(), _example()


class ReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        # torch.relu, not nn.ReLU: torch's relu_*_TESTING_ONLY backends rewrite `torch.relu` calls.
        return self.fc2(torch.relu(self.fc1(x)))


def relu_net():
    """For doctor: Linear -> relu -> Linear (the TESTING_ONLY backends and inductor's relu bug act on relu)."""
    torch.manual_seed(0)
    return ReluNet(), _example()


# --- backends -------------------------------------------------------------------------------------

def crash_backend(gm, example_inputs):
    """A backend whose compile step fails, like a compiler bug would."""
    raise RuntimeError("planted backend crash")


def drift_backend(gm, example_inputs):
    """A backend that compiles fine but perturbs every floating output by 1e-2."""

    def run(*args):
        out = gm(*args)
        return type(out)(t + 1e-2 if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in out)

    return run
