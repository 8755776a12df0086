"""Why torch.compile did not help, and where it breaks: `kiln explain` and `kiln doctor`.

- explain: graphs, graph breaks (category, user file:line, torch's explanation, a fix), recompiles
  (failing guard, fix), ops per graph, fullgraph yes/no, seed expectations vs this torch;
- doctor: the eager -> aot_eager -> aot_eager_decomp_partition -> inductor ladder, judged against eager
  and a float64 reference by the dynamo benchmark harness rule; bisection and a repro script.

Entry points, imported from their modules (the package itself imports nothing, so the requests of
diagnose_request load without torch): explain.explain_target, doctor.run_doctor, target.load_target,
and diagnose_command, which runs each command's request.
"""
