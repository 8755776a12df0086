"""Tables at several terminal widths: the file:line of a finding and its fix are never cut."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kiln.advise.findings import Finding, render
from kiln.diagnose.console import render_explain

WHERE = "src/my_project/models/very_long_module_name_for_a_vision_transformer.py:1234"
FIX = ("move the print out of forward, or guard it with `if not torch.compiler.is_compiling():` so the traced "
       "graph never sees it")


def _text(renderable, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def _report(n: int = 2) -> dict:
    brk = {"file": WHERE.rsplit(":", 1)[0], "line": 1234, "code": "print(x.shape)", "category": "print",
           "explanation": "Dynamo does not know how to trace the builtin `print`", "reason": "", "hint": FIX,
           "frame_skipped": False}
    return {"target": "my_models.py:build", "torch": "2.13", "backend": "inductor", "train": False,
            "inputs": ["[8, 3, 224, 224]"], "input_source": "example_inputs", "clean": False, "graph_count": 2,
            "graph_break_count": n, "recompiles": [], "ops_per_graph": [10, 12], "fullgraph_ok": False,
            "fullgraph_checked": True, "breaks": [dict(brk, line=1234 + i) for i in range(n)]}


@pytest.mark.parametrize("width", [80, 100, 120, 140, 200])
def test_explain_keeps_file_line_and_the_whole_fix_at_every_width(width):
    text = _text(render_explain(_report()), width)
    assert "…" not in text
    for i in range(2):
        where = f"{WHERE.rsplit(':', 1)[0]}:{1234 + i}"
        assert any(where in line for line in text.splitlines()), (width, text)
    if width <= 140:  # too narrow for the five columns: one block per finding, the fix whole in it
        assert FIX in _flat(text)
        assert "fix:" in text


def test_explain_uses_the_table_when_it_fits():
    text = _text(render_explain(_report(1)), 260)
    assert "┃ #" in text or "┃   #" in text or "#" in text.splitlines()[4]
    assert "fix:" not in text


@pytest.mark.parametrize("width", [80, 100, 140])
def test_advise_findings_keep_the_fix_when_narrow(width):
    findings = [Finding("cpu_threads", "CPU threads and pinning", "advice",
                        "2 intra-op threads on 2 cores while the load average is 7.9", "cpu.threads=1",
                        "8 ms/step vs 227 ms/step")]
    flat = _flat(_text(render(findings, "kiln advise"), width))
    assert "cpu.threads=1" in flat and "load average is" in flat and "…" not in flat
