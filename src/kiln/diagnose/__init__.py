"""Why torch.compile did not help, and where it breaks: `kiln explain` and `kiln doctor`.

- explain: graphs, graph breaks (category, user file:line, torch's explanation, a fix), recompiles
  (failing guard, fix), ops per graph, fullgraph yes/no, seed expectations vs this torch;
- doctor: the eager -> aot_eager -> aot_eager_decomp_partition -> inductor ladder, judged against eager
  and a float64 reference by the dynamo benchmark harness rule; bisection and a repro script.
"""

from __future__ import annotations

from kiln.diagnose.call_target import EagerFailure
from kiln.diagnose.doctor import run_doctor
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import Target, load_target

__all__ = ["EagerFailure", "Target", "explain_target", "load_target", "run_doctor"]
