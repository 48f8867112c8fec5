"""Atomic writes: every writer writes to a temporary name in the destination folder, fsyncs it and renames
it into place, so a crashed stage never leaves a file that looks finished; a temporary left by a killed
writer is removed by the next write to the same path (docs/architecture.md, "Writes are atomic")."""


import contextlib
import errno
import io
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


from layersim.errors import DiskFullError


# Read once at import (single-threaded then): os.umask can only be read by setting it.
_UMASK = os.umask(0)
os.umask(_UMASK)

# Temporaries are named .<name>.<host>-<pid>-<random>.tmp: hidden, never a result's name, and a later
# write to the same path can tell that the process which left one behind is gone.
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of `path` left by writers on this host whose process is gone (killed
    mid-write); return what was deleted. Temporaries of live writers are left alone."""
    path = Path(path)
    prefix = f".{path.name}."
    removed = []
    if not path.parent.is_dir():
        return removed
    for entry in path.parent.iterdir():
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        parts = name[len(prefix):-len(".tmp")].rsplit("-", 2)
        if len(parts) == 3 and parts[0] == _HOST and parts[1].isdigit() and not _process_alive(int(parts[1])):
            _remove(entry)
            removed.append(entry)
    return removed


def _fsync(path: Path) -> None:
    """Flush a file, or a folder's entries, to disk, so that a rename never lands before the data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for folder, _, files in os.walk(path):
            for name in files:
                _fsync(Path(folder) / name)
            _fsync(Path(folder))
    else:
        _fsync(path)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# Writers built in Rust (safetensors' save_file) raise their own exception type for an OS error, its number only in
# the text: "Error while serializing: I/O error: No space left on device (os error 28)".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


# torch.save's zip writer reports a failed write without the OS error ("[enforce fail at inline_container.cc:…]
# unexpected pos …", "PytorchStreamWriter failed writing file …"): a RuntimeError while the volume has less than
# this left is taken for a full disk.
_NEARLY_FULL_BYTES = 1 << 20


def _disk_full(err: BaseException, folder: Path) -> bool:
    """Whether `err`, raised while writing into `folder`, says that the disk (or the user's quota) is full."""
    if isinstance(err, OSError):
        return err.errno in _DISK_FULL
    number = _RUST_OS_ERROR.search(str(err))
    if number is not None:
        return int(number.group(1)) in _DISK_FULL
    return isinstance(err, RuntimeError) and shutil.disk_usage(folder).free < _NEARLY_FULL_BYTES


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; on success rename it onto `path`, on error delete it.

    The temporary is hidden (``.<name>.<host>-<pid>-<random>.tmp``); one left by a writer that was
    killed is deleted by the next atomic write to the same path. An existing folder at `path` is
    moved aside and replaced by a rename, so at no moment does a half-deleted folder sit at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    prefix = f".{path.name}.{_HOST}-{os.getpid()}-"
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        # mkstemp/mkdtemp create private files; give the result the permissions of a normal write.
        os.chmod(tmp, (0o777 if is_dir else 0o666) & ~_UMASK)
        _fsync_tree(tmp)
        if is_dir and path.is_dir() and not path.is_symlink():
            old = tmp.with_name(tmp.name[:-len(".tmp")] + "_old.tmp")
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync(path.parent)
    except BaseException as err:
        full = _disk_full(err, path.parent)  # before the partial file is removed, which frees its space
        _remove(tmp)
        if full:
            raise DiskFullError(path) from err
        raise


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write `obj` as stable, human-readable JSON (sorted keys, so reruns give identical bytes)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_figure(fig, path: str | os.PathLike, dpi: int = 150) -> None:
    """Save a matplotlib figure atomically as PNG."""
    # Rendered in memory, then written: a full disk then fails as the OSError it is (PIL's PNG writer
    # turns it into "'_idat' object has no attribute 'fileno'").
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())
