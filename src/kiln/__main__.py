import logging
import os
import sys

from kiln.cli.main import main

code = main()
if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
    # A rank under torchrun leaves without interpreter finalization. By now the run has closed and
    # flushed everything it writes (checkpoints, metrics, summary.json, its report). With gloo and
    # FSDP2/DTensor, a rank occasionally aborted in C++ static destructors at exit ("terminate
    # called without an active exception", SIGABRT) after a completed run; torchrun then reports
    # the run failed (seen twice in CI on torch 2.13).
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
raise SystemExit(code)
