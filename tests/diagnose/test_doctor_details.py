"""kiln doctor details: a fake implementation with the wrong *shape* is reported as a shape mismatch, and
a config the bisector blamed is reported as the setting that fixes it, re-run to verify."""

from __future__ import annotations

import pytest

from kiln.diagnose.bisect import _summary, config_change, verify_config
from kiln.diagnose.crash import _mismatch
from kiln.diagnose.doctor import run_doctor
from kiln.diagnose.target import load_target

from .conftest import CORPUS, statement_line

OPS = CORPUS / "custom_ops.py"


def test_fake_with_the_wrong_shape_is_a_shape_mismatch_in_the_crossref_stage(tmp_path):
    stage = "aot_eager_decomp_partition_crossref"
    report = run_doctor(load_target(f"{OPS}:pooled"), stages=[stage], out_dir=tmp_path, repro=False)
    first = report["first_failure"]
    assert first["status"] == "crash" and first["op"] == "kiln_corpus::pool_pairs" and first["mismatch"] == "shape"
    assert first["where"]["line"] == statement_line(OPS, "h = pool_pairs(self.fc(x))")
    what, _, where = first["diagnosis"].partition("; stage ")
    assert "reports a different shape than its real kernel returns" in what and "stride" not in what
    assert "[2, 16] vs [4, 16]" in what and where.startswith(stage)
    assert "output shape the kernel returns" in first["fix"]


def test_inductor_size_assertion_reads_as_shape_and_stride_assertion_as_strides():
    what, note = _mismatch("AssertionError: expected size 2==4, stride 16==16 at dim=0")
    assert what == "shape" and note == " (size at dim 0: 2 in the real output, 4 in the fake)"
    what, note = _mismatch("AssertionError: expected size 4==4, stride 16==1 at dim=0")
    assert what == "strides" and "(16,), the fake implementation said (1,)" in note
    assert _mismatch("Dtypes torch.float32 and torch.float16 are not equal")[0] == "dtype"


@pytest.mark.parametrize(("subsystem", "setting"), [
    ("inductor_emulate_precision_casts", "torch._inductor.config.emulate_precision_casts = True"),
    ("inductor_layout_optimization", "torch._inductor.config.layout_optimization = False"),
])
def test_a_bisected_config_is_reported_as_the_value_that_fixes_it(subsystem, setting):
    result = {"backend": "inductor", "subsystem": subsystem, "bisect_number": 0, "debug_info": subsystem}
    summary = _summary(result)
    assert f"setting `{setting}` fixes it" in summary and "turning it off" not in summary
    assert config_change(subsystem)["setting"] == setting
    assert config_change("lowerings") is None


def test_the_config_fix_is_re_run_before_it_is_called_verified():
    import torch._inductor.config as inductor_config

    change = config_change("inductor_emulate_precision_casts")
    tried = verify_config(lambda: inductor_config.emulate_precision_casts, change)
    assert tried["verified"] is True and tried["fix"] == change["setting"]
    assert inductor_config.emulate_precision_casts is False  # patched only while re-running
    assert verify_config(lambda: False, change)["verified"] is False


def test_doctor_and_its_repro_take_python_value_inputs(tmp_path):
    """A dataclass among the inputs: doctor runs, and its repro script loads the inputs back and reproduces."""
    import subprocess
    import sys

    from .conftest import PLANTED

    report = run_doctor(load_target(f"{CORPUS / 'task_heads.py'}:build"), stages=["eager"],
                        backends=[f"{PLANTED}:drift_backend"], out_dir=tmp_path)
    assert report["first_failure"]["status"] == "accuracy_fail"
    assert "weights_only=False" in open(report["repro"]).read()
    proc = subprocess.run([sys.executable, report["repro"]], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and "reproduced: accuracy failure" in proc.stdout, proc.stdout + proc.stderr[-2000:]
