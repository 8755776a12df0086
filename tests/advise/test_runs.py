"""The measured advise checks read their gain from the times they print (kiln.bench.ratios)."""

from __future__ import annotations

import re

import torch

from kiln.advise import runs
from kiln.config import load_config


class _Session:
    def __init__(self, rows):
        self.rows = rows

    def eager(self, precision, loss="task"):
        return self.rows[precision], None


def _row(ms, ref, **kw):
    return {"status": "ok", "step_ms": ms, "eager_fp32_step_ms": ref, "speedup_vs_eager_fp32": ref / ms, **kw}


def test_precision_gain_divides_the_two_times_it_prints(monkeypatch):
    """Seen: `1.52x eager (1.49e+03 -> 335 ms/step)`: the fp32 row alone read 1490 ms, the bf16 row
    335 ms beside an fp32 eager run of 509 ms. The gain is 509/335 and says so."""
    monkeypatch.setattr(runs, "bf16_capable", lambda device: True)
    cfg = load_config(None, ["training.device=cpu"])
    session = _Session({"fp32": _row(1490.0, 1490.0), "bf16-mixed": _row(335.0, 509.0)})
    finding = runs.check_precision(cfg, torch.device("cpu"), session=session)
    before, after = map(float, re.search(r"fp32 ([\d.e+]+) -> bf16-mixed ([\d.e+]+) ms/step", finding.gain).groups())
    ratio = float(re.match(r"([\d.]+)x", finding.gain).group(1))
    assert (before, after) == (509.0, 335.0) and ratio == round(before / after, 2) == 1.52
    assert finding.status == "advice"


def test_precision_gain_under_the_two_percent_rule_or_noisy_is_not_advised(monkeypatch):
    monkeypatch.setattr(runs, "bf16_capable", lambda device: True)
    cfg = load_config(None, ["training.device=cpu"])
    small = _Session({"fp32": _row(100.0, 100.0), "bf16-mixed": _row(99.0, 100.9)})  # 1.019x
    finding = runs.check_precision(cfg, torch.device("cpu"), session=small)
    assert finding.status == "info" and "less than 2% faster" in finding.fix
    noisy = _Session({"fp32": _row(100.0, 100.0), "bf16-mixed": _row(50.0, 100.0, noisy=True)})
    finding = runs.check_precision(cfg, torch.device("cpu"), session=noisy)
    assert finding.status == "info" and "too noisy" in finding.fix and finding.gain.startswith("~2.0x?")
