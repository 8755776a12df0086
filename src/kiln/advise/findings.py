"""One finding of `kiln advise`: what was checked, what was found, the concrete fix, and the gain
measured on this machine where it can be measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kiln.tables import Adaptive

# ok: nothing to fix; advice: a fix that pays (or could not be measured); info: found, but measured
# not to pay here; n/a: the check does not apply (e.g. no GPU); error: the check itself failed.
STATUSES = ("ok", "advice", "info", "n/a", "error")


@dataclass
class Finding:
    check: str
    """Stable id: alignment, precision, channels_last, data_loader, graph_breaks, launch_bound, strategy, cpu_threads."""
    title: str
    status: str
    finding: str
    fix: str | None = None
    gain: str | None = None
    """The measured gain in words (`1.8 ms/step saved (12%)`), or None where nothing was measured."""
    gain_frac: float | None = None
    """Measured time saved as a fraction of the current time (0.12 = 12% faster), where measured."""
    measured: dict[str, Any] = field(default_factory=dict)
    """The figures behind the verdict (times, fractions, counts)."""
    details: list[dict[str, Any]] = field(default_factory=list)
    """Per-item evidence: layers, breaks, ..."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"finding status must be one of {STATUSES}, got {self.status!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def failed(check: str, title: str, exc: BaseException) -> Finding:
    """A check that raised: reported as a row, the other checks go on."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return Finding(check, title, "error", f"the check failed: {type(exc).__name__}: {text}"[:300])


def saved(before_s: float, after_s: float, per: str = "step") -> tuple[str, float]:
    """(`0.80 ms/step saved (12%)` or `0.10 ms/step slower (3%)`, fraction saved) from two medians."""
    delta = before_s - after_s
    frac = delta / before_s if before_s > 0 else 0.0
    word = "saved" if delta >= 0 else "slower"
    amount = f"{abs(delta) * 1e3:.3g} ms" if abs(delta) >= 1e-4 else f"{abs(delta) * 1e6:.3g} us"
    return f"{amount}/{per} {word} ({abs(frac):.0%})", frac


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def render(findings: list[Finding], title: str):
    from rich.table import Table

    styles = {"ok": "green", "advice": "bold yellow", "info": "cyan", "n/a": "dim", "error": "red"}
    table = Table(title=title, title_justify="left", show_lines=True)
    for name in ("check", "status", "finding", "fix", "measured gain"):
        table.add_column(name, overflow="fold")
    for f in findings:
        style = styles.get(f.status, "")
        table.add_row(f.title, f"[{style}]{f.status}[/{style}]", f.finding, f.fix or "-", f.gain or "-")
    return Adaptive(table, readable=30)
