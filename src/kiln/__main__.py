import logging
import os
import sys

from kiln.cli.main import main

try:
    code = main()
except SystemExit as exc:  # kiln.checkpoint.signals.SignalExit: a second SIGTERM / SIGHUP
    if not (isinstance(exc.code, int) and exc.code > 128):
        raise
    code = exc.code
if code > 128 or os.environ.get("TORCHELASTIC_RUN_ID") is not None:
    # Stopped by a second signal (130, 128 + SIGTERM/SIGHUP): "now" means now, not once a thread
    # still writing the abandoned save (DCP's writer, in the middle of a large tensor) is done, which
    # interpreter finalization would wait for. Its partial save is already removed and reported.
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
