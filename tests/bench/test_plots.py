"""The bench charts: a panel only where some row has data, values written on the bars, decode on
its own axis (kiln.bench.compile.compile_report, llm_report, scale_report)."""

from __future__ import annotations

import matplotlib.figure
import pytest

from kiln.bench.compile import compile_report
from kiln.bench.llm import llm_report
from kiln.bench.scale import scale_report


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions save, kept for inspection."""
    seen: list[matplotlib.figure.Figure] = []
    save = matplotlib.figure.Figure.savefig

    def capture(self, *args, **kwargs):
        seen.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", capture)
    return seen


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def _compile_rows(mem: bool):
    rows = []
    for mode, ms, eager in (("eager", 12.461, 12.461), ("default", 10.971, 82.94)):
        rows.append({"runner": "kiln", "precision": "fp32", "loss": "task", "mode": mode, "backend": "inductor",
                     "scope": "model", "regional": False, "cudagraphs": False, "status": "ok", "step_ms": ms,
                     "step_ms_p10": ms * 0.98, "step_ms_p90": ms * 1.02, "eager_step_ms": eager,
                     "eager_step_ms_p10": eager * 0.98, "eager_step_ms_p90": eager * 1.02, "speedup": eager / ms,
                     "eager_fp32_step_ms": eager, "speedup_vs_eager_fp32": eager / ms,
                     "peak_mem_bytes": 300 * 2**20 if mem else None, "memory_compression": 1.0 if mem else None})
    return rows


@pytest.mark.parametrize(("mem", "panels"), [(False, 1), (True, 2)])
def test_compile_chart_has_no_empty_memory_panel_and_labels_each_ratio_with_its_times(tmp_path, figures, mem, panels):
    assert compile_report.plot(_compile_rows(mem), tmp_path / "c.png", "t") is not None
    axes = figures[-1].axes
    assert len(axes) == panels
    assert " ~7.6x? = 82.9/11 ms" in _texts(axes[0])  # its eager reference moved 566 %: hatched, not ranked
    if mem:
        assert " 300 MiB, 1.00x" in _texts(axes[1])


def _llm_rows(mem: bool):
    rows = [{"engine": "hf", "quant": None, "status": "ok", "prefill_tok_s": 1234.0, "decode_tok_s": 5.2,
             "roofline_tok_s": 9000.0},
            {"engine": "kiln", "quant": None, "status": "ok", "prefill_tok_s": 2400.0, "decode_tok_s": 16.3,
             "roofline_tok_s": 9000.0}]
    for row in rows:
        row["peak_mem_bytes"] = 3 * 2**30 if mem else None
    return rows


@pytest.mark.parametrize(("mem", "panels"), [(False, 3), (True, 4)])
def test_llm_chart_puts_decode_on_its_own_axis_with_values(tmp_path, figures, mem, panels):
    assert llm_report.plot(_llm_rows(mem), tmp_path / "l.png", "t") is not None
    axes = figures[-1].axes
    assert len(axes) == panels
    prefill, decode, roof = axes[:3]
    assert decode.get_xlim()[1] < 25  # 5-16 tok/s fill their own axis, not a 9,000 tok/s one
    assert " 5.2" in _texts(decode) and " 16.3" in _texts(decode) and " 2,400" in _texts(prefill)
    assert " 0.1% of 9,000 tok/s" in _texts(roof) and " 0.2% of 9,000 tok/s" in _texts(roof)


def test_llm_chart_shows_a_peer_that_reports_only_request_tok_s(tmp_path, figures):
    rows = _llm_rows(False)
    rows[1]["request_tok_s"] = 368.6
    rows.append({"engine": "gpt-fast", "quant": None, "status": "ok", "request_tok_s": 261.6})
    llm_report.plot(rows, tmp_path / "l.png", "t")
    axes = figures[-1].axes
    request = next(ax for ax in axes if ax.get_xlabel().startswith("request tokens/s"))
    assert " 369" in _texts(request) and " 262" in _texts(request)
    llm_report.plot(_llm_rows(False), tmp_path / "m.png", "t")  # no peer: no such panel
    assert not any(ax.get_xlabel().startswith("request") for ax in figures[-1].axes)


def test_llm_chart_without_rooflines_drops_that_panel(tmp_path, figures):
    rows = _llm_rows(False)
    for row in rows:
        row["roofline_tok_s"] = None
    llm_report.plot(rows, tmp_path / "l.png", "t")
    assert [ax.get_xlabel() for ax in figures[-1].axes] == ["prefill tokens/s", "decode tokens/s"]


def test_scale_chart_without_a_step_to_split_has_one_panel(tmp_path, figures):
    rows = [{"kind": "point", "role": "baseline", "status": "ok", "step_ms": 1.0, "variant": "ddp", "world": 1,
             "efficiency": 1.0}]
    assert scale_report.plot(rows, tmp_path / "s.png", "t") is not None
    assert len(figures[-1].axes) == 1


def test_llm_table_flags_a_fraction_above_its_ceiling():
    import io

    from rich.console import Console

    rows = _llm_rows(False)
    rows[1]["prefill_peak_frac"] = 1.28
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(llm_report.render_table(rows, "t"))
    assert "kiln: 128% of the matmul peak: above the ceiling" in " ".join(console.export_text().split())
