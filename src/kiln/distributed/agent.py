"""`python -m kiln.distributed.agent TORCHRUN_ARGS...`: torchrun, handing the ranks' failures back.

The same parser and elastic agent as `python -m torch.distributed.run` (restarts, rendezvous,
signal forwarding), with one difference: when the group fails for good and the kiln launcher asked
for reports ($KILN_LAUNCH_REPORT_DIR), the failed ranks (exit code or signal, and the report each
wrote into its torchelastic error file) go to that directory as JSON instead of torchrun's
ChildFailedError traceback on the console, and the exit code is 1. The launcher then names the
rank that failed first in one short message.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from kiln.distributed.failures import REPORT_ENV, dump_failures

    report = os.environ.get(REPORT_ENV)
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as exc:
        if not report:
            raise
        dump_failures(report, exc.failures)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
