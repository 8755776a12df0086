from __future__ import annotations

import io
import json

from rich.console import Console

from kiln.monitor.env import collect_env, render_env

KEYS = {
    "python",
    "platform",
    "kiln",
    "torch",
    "cuda",
    "cudnn",
    "cuda_available",
    "device_count",
    "gpus",
    "driver",
    "cpu",
    "cpu_count",
    "triton",
    "compile_backends",
    "compile_modes",
    "cxx_compiler",
    "packages",
    "recommendations",
}


def test_collect_env_keys_and_json() -> None:
    env = collect_env()
    assert KEYS <= env.keys()
    assert json.loads(json.dumps(env)) == env
    assert "inductor" in env["compile_backends"]
    assert "default" in env["compile_modes"]
    assert {"transformers", "timm", "tensorboard"} <= env["packages"].keys()
    assert all(isinstance(r, str) for r in env["recommendations"])
    if not env["cuda_available"]:
        assert env["gpus"] == [] and env["device_count"] == 0


def test_no_compiler_recommendation(monkeypatch) -> None:
    monkeypatch.setattr("kiln.monitor.env.shutil.which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    env = collect_env()
    assert env["cxx_compiler"] is None  # (driver may still come from NVML where nvidia-ml-py is installed)
    assert any("aot_eager" in r for r in env["recommendations"])


def test_render_env() -> None:
    buffer = io.StringIO()
    Console(file=buffer, width=120).print(render_env(collect_env()))
    out = buffer.getvalue()
    assert "torch" in out and "Recommended" in out
