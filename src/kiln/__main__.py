import logging
import os
import sys

from kiln.cli.main import main

code = main()
if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
    # A rank under torchrun leaves without interpreter finalization. By now the run has closed and
    # flushed everything it writes (checkpoints, metrics, summary.json, its report). With gloo and
    # FSDP2/DTensor, a rank can abort in C++ static destructors at exit ("terminate called
    # without an active exception", SIGABRT) after a completed run, and torchrun would then report
    # the run failed.
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
raise SystemExit(code)
