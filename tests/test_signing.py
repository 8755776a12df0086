from __future__ import annotations

import stat

import pytest

from kiln.signing import KEY_FILE, UntrustedFileError, config_dir, secret_key, sign, verify


def test_the_key_is_private_and_made_once(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "cfg"))
    key = secret_key()
    assert key is not None and len(key) == 32
    path = config_dir() / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret_key() == key
    assert [p.name for p in path.parent.iterdir()] == [KEY_FILE]  # no temporary left behind


def test_a_readable_key_is_not_a_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path))
    signed = sign(b"payload", purpose=b"t")
    (tmp_path / KEY_FILE).chmod(0o644)
    with pytest.raises(UntrustedFileError, match=r"is readable or writable by others \(mode 644\).*chmod 600"):
        verify(signed, purpose=b"t")


def test_a_malformed_key_is_named_as_malformed_not_as_missing(tmp_path, monkeypatch, caplog):
    from kiln.compile_cache import save_artifacts  # noqa: F401  (its warning uses key_problem)
    from kiln.signing import key_problem

    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path))
    (tmp_path / KEY_FILE).write_bytes(b"short")
    (tmp_path / KEY_FILE).chmod(0o600)
    assert sign(b"payload", purpose=b"t") is None  # never replaced behind the user's back
    assert "is malformed (5 bytes, not 32)" in key_problem()
    with pytest.raises(UntrustedFileError, match="is malformed"):
        verify(b"x" * 40, purpose=b"t")
    (tmp_path / KEY_FILE).unlink()
    assert "no kiln key in" in key_problem()


def test_verify_refuses_altered_bytes_another_purpose_and_another_key(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "a"))
    signed = sign(b"payload", purpose=b"t")
    assert verify(signed, purpose=b"t") == b"payload"
    with pytest.raises(UntrustedFileError):
        verify(signed[:-1] + b"X", purpose=b"t")
    with pytest.raises(UntrustedFileError):
        verify(signed, purpose=b"other")
    with pytest.raises(UntrustedFileError):
        verify(b"short", purpose=b"t")
    monkeypatch.setenv("KILN_CONFIG_DIR", str(tmp_path / "b"))
    secret_key()
    with pytest.raises(UntrustedFileError):
        verify(signed, purpose=b"t")
