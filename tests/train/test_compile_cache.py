"""A run dir's compile_cache.bin is untrusted: only what kiln signed under this user's key loads,
nothing in a crafted file runs, and no artifact is written outside the cache dir."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from kiln.compile_cache import ARTIFACTS_FILE, UnsafeArtifactError, artifacts_supported, load_artifacts, load_blob

pytestmark = pytest.mark.skipif(not artifacts_supported(), reason="torch without compile cache artifacts")


class _Payload:
    def __init__(self, canary: str) -> None:
        self.canary = canary

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


def _blob(artifacts: list[tuple[str, str, bytes]]) -> bytes:
    """Torch's own container format holding `(type, key, content)` artifacts."""
    from torch.compiler._cache import CacheArtifactFactory, CacheArtifactManager, _serialize_single_cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    CacheArtifactManager._ensure_cache_artifacts_registered()
    grouped: dict[str, list] = {}
    for kind, key, content in artifacts:
        grouped.setdefault(kind, []).append(CacheArtifactFactory.create(kind, key, content))
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend(grouped.items())
    return serializer.to_bytes()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(path))
    return path


def test_a_crafted_cache_in_a_run_dir_runs_nothing(tmp_path, cache_dir):
    canary = tmp_path / "PAYLOAD_RAN"
    evil = pickle.dumps(_Payload(str(canary)))
    run = tmp_path / "run"
    run.mkdir()
    (run / ARTIFACTS_FILE).write_bytes(_blob([("inductor", "fgszc5k66fumrfzpvs5ne7uongykgulpzvamjzez3y3xxo", evil),
                                              ("aot_autograd", "auodorrnks4tp5ma7pjdc75ndryyjw4p3z5ddn2q", evil)]))
    assert load_artifacts(run / ARTIFACTS_FILE) is None
    assert not canary.exists()
    assert not cache_dir.exists() or not any(cache_dir.rglob("*"))  # nothing of it was even written


def test_an_artifact_key_outside_the_cache_dir_writes_nothing(tmp_path, cache_dir):
    outside = tmp_path / "outside" / "planted"
    run = tmp_path / "run"
    run.mkdir()
    (run / ARTIFACTS_FILE).write_bytes(_blob([("aot_autograd", str(outside), b"x")]))
    assert load_artifacts(run / ARTIFACTS_FILE) is None
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize("key", ["/etc/kiln_planted", "../../kiln_planted", "ab/../../../x"])
def test_even_a_trusted_blob_may_not_name_a_path_outside(tmp_path, cache_dir, key):
    with pytest.raises(UnsafeArtifactError, match="outside the cache dir"):
        load_blob(_blob([("aot_autograd", key, b"x")]))
    assert not (tmp_path / "kiln_planted").exists()


def test_a_signed_cache_loads_and_an_altered_or_foreign_one_does_not(tmp_path, cache_dir, monkeypatch, caplog):
    from kiln.compile_cache import save_artifacts

    torch._dynamo.reset()
    torch.compile(lambda x: (x * 3).cos(), dynamic=False)(torch.ones(5))
    path = tmp_path / ARTIFACTS_FILE
    assert save_artifacts(path)
    assert (load_artifacts(path) or 0) > 0
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # one bit of the payload
    path.write_bytes(bytes(data))
    assert load_artifacts(path) is None
    assert "signature does not match" in caplog.text
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "another_user"))  # another key: not ours
    assert load_artifacts(path) is None
    torch._dynamo.reset()
