"""Atomic output: write to a temporary file beside the target, rename on success.

A crash, a kill or an error never leaves a half-written file under the final name.
"""

import contextlib
import os
import tempfile
from pathlib import Path

from kws.errors import KwsError


def ensure_dir(path):
    """Create a directory (and parents); a clear error when it cannot be written."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KwsError(f"{path}: cannot create output folder ({err.strerror})") from None
    if not os.access(path, os.W_OK):
        raise KwsError(f"{path}: output folder is not writable")
    return path


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to `path`; rename it to `path` when the block succeeds."""
    path = Path(path)
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path, mode="w", encoding="utf-8"):
    """Open a temporary file for writing; it replaces `path` only if the block succeeds."""
    binary = "b" in mode
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=None if binary else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())


def current_umask():
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_torch_save(obj, path):
    """torch.save through a temporary file, so a killed writer never leaves a truncated checkpoint."""
    import torch

    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())


def file_digest(path, length=None):
    """sha256 of a file's content in hex, the first `length` digits when given."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:length]
