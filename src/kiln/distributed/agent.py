"""`python -m kiln.distributed.agent TORCHRUN_ARGS...`: torchrun, with kiln's failure reports and stop signals.

The same parser and elastic agent as `python -m torch.distributed.run` (restarts, rendezvous),
with two differences:

- Failures: when the group fails for good and the kiln launcher asked for reports
  ($KILN_LAUNCH_REPORT_DIR), the failed ranks (exit code or signal, and the report each wrote into
  its torchelastic error file) go to that directory as JSON instead of torchrun's ChildFailedError
  traceback on the console, and the exit code is 1. The launcher then names the rank that failed
  first in one short message.
- Stop signals (SIGINT, SIGTERM, SIGHUP): torchrun's agent turns one into a `SignalException`,
  passes the signal to the ranks, kills them after its shutdown timeout (30 s) and dies with a
  traceback, whatever the ranks were doing. A kiln rank treats the signal as a request: it saves a
  checkpoint at the next step all ranks agree on and exits 0, which may take longer than 30 s (a
  log interval of slow steps, a large checkpoint). So this agent passes the signal to the ranks'
  process groups (`kiln.distributed.signal_relay.SignalRelay`) and goes on supervising them: ranks that
  saved and exited 0 end the job as a success, ranks that failed are reported as failures, and no
  group is restarted after a stop was asked for. A second signal is passed on too (the ranks then
  stop at once).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from kiln.distributed.signal_relay import SignalRelay, signal_group
from kiln.failure.ranks import REPORT_ENV, dump_failures


def stoppable_agent_class(relay: SignalRelay) -> type:
    """torchrun's LocalElasticAgent, with `relay` passing stop signals to its ranks (see the module
    docstring). torchrun installs its own handlers each time it starts the ranks; the relay takes
    the signals back right after."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class StoppableAgent(LocalElasticAgent):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            relay.forward = self.stop_ranks

        def _start_workers(self, worker_group):
            result = super()._start_workers(worker_group)
            relay.install()
            if relay.last is not None:  # asked to stop while the ranks were starting: they hear it now
                self.stop_ranks(relay.last)
            return result

        def stop_ranks(self, signum: int) -> None:
            """Pass `signum` to every rank's process group; a stop asked for is not a failure to
            recover from, so no restart follows."""
            self._remaining_restarts = 0
            pcontext = getattr(self, "_pcontext", None)
            if pcontext is not None:
                for pid in pcontext.pids().values():
                    signal_group(pid, signum)

    return StoppableAgent


def main(argv: list[str] | None = None) -> int:
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # Until the agent exists, a stop signal is only remembered (the agent passes it on as the ranks start).
    relay = SignalRelay(forward=lambda signum: None)
    # torchrun's launch_agent builds its agent from this module-level name: ours, in this process
    # only. A torch that builds it otherwise keeps torchrun's own signal handling.
    stoppable = hasattr(launcher_api, "LocalElasticAgent")
    if stoppable:
        launcher_api.LocalElasticAgent = stoppable_agent_class(relay)
        # After a stop, ranks that die of the signal are expected: not torchrun's "failed (exitcode: -15)".
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
            lambda record: relay.last is None)
    report = os.environ.get(REPORT_ENV)
    try:
        with relay if stoppable else contextlib.nullcontext():
            run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as exc:
        if not report:
            raise
        dump_failures(report, exc.failures)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
