"""Authenticating files kiln wrote itself, before it loads anything from them that could run code.

Some files kiln keeps with a run cannot be read safely whatever their contents: torch's compile
cache artifacts are pickles that torch unpickles while compiling. A run dir is untrusted input (it
may be copied from a colleague or live on a shared filesystem), so such a file is loaded only when
an HMAC-SHA256 tag written next to its bytes verifies under a secret key that never lives in a run
dir: `$KILN_CONFIG_DIR/secret.key`, else `$XDG_CONFIG_HOME/kiln/secret.key`, else
`~/.config/kiln/secret.key`, created on first use with mode 0600. A file written under another
key (another user, another machine) or altered in any byte fails the check and is not loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

KEY_FILE = "secret.key"
_KEY_BYTES = 32
_TAG_BYTES = hashlib.sha256().digest_size


class UntrustedFileError(ValueError):
    """A signed file whose tag does not verify under this user's key (or that has no tag)."""


def config_dir() -> Path:
    if os.environ.get("KILN_CONFIG_DIR"):
        return Path(os.environ["KILN_CONFIG_DIR"]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "kiln"


def secret_key(*, create: bool = True) -> bytes | None:
    """This user's key: read it, or (with `create`) make it atomically with mode 0600. None when
    there is none and it may not or cannot be created, or when others can read or write it."""
    path = config_dir() / KEY_FILE
    key = _read_key(path)
    if key is not None or not create:
        return key
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(_KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(tmp, path)
        tmp.unlink()
    except OSError:
        return None
    return _read_key(path)


def _read_key(path: Path) -> bytes | None:
    return _key_and_problem(path)[0]


def _key_and_problem(path: Path) -> tuple[bytes | None, str | None]:
    """(the key, None), or (None, why `path` is no usable key: absent, shared, malformed)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None, f"no kiln key in {path.parent}"
    except OSError as exc:
        return None, f"kiln key {path} cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(info.st_mode):
        return None, f"kiln key {path} is not a regular file (a link?); remove it and kiln makes a new one"
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):  # others could read (forge) or replace it: not a secret
        return None, (f"kiln key {path} is readable or writable by others (mode {stat.S_IMODE(info.st_mode):o}), "
                      f"so it is no secret: chmod 600 {path}, or remove it and kiln makes a new one")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return None, f"kiln key {path} belongs to another user (uid {info.st_uid}); remove it or set KILN_CONFIG_DIR"
    try:
        with open(path, "rb") as f:
            key = f.read(_KEY_BYTES + 1)
    except OSError as exc:
        return None, f"kiln key {path} cannot be read ({exc.strerror or exc})"
    if len(key) != _KEY_BYTES:
        return None, (f"kiln key {path} is malformed ({len(key)}{'+' if len(key) > _KEY_BYTES else ''} bytes, "
                      f"not {_KEY_BYTES}): remove it and kiln makes a new one")
    return key, None


def key_problem() -> str | None:
    """Why this user has no usable kiln key (for messages), or None when it has one."""
    return _key_and_problem(config_dir() / KEY_FILE)[1]


def sign(payload: bytes, *, purpose: bytes) -> bytes | None:
    """`tag + payload`, or None when no key can be had (then nothing should be saved)."""
    key = secret_key()
    if key is None:
        return None
    return hmac.new(key, purpose + b"\0" + payload, hashlib.sha256).digest() + payload


def verify(signed: bytes, *, purpose: bytes) -> bytes:
    """The payload of `signed` when its tag verifies under this user's key; else UntrustedFileError
    (nothing of the payload has been interpreted)."""
    key, problem = _key_and_problem(config_dir() / KEY_FILE)
    if key is None:
        raise UntrustedFileError(f"{problem}: nothing can be authenticated with it")
    if len(signed) < _TAG_BYTES:
        raise UntrustedFileError("too short to carry kiln's signature")
    tag, payload = signed[:_TAG_BYTES], signed[_TAG_BYTES:]
    expected = hmac.new(key, purpose + b"\0" + payload, hashlib.sha256).digest()
    if not hmac.compare_digest(tag, expected):
        raise UntrustedFileError("its signature does not match this user's kiln key (written elsewhere or altered)")
    return payload
