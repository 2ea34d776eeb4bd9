"""Atomic writes of a folder (a zarr store) or a file: readers see the old or the new version.

Never a half-written one: not after a full disk, an I/O error or a killed process.

Everything is written into a hidden temporary sibling (``.NAME.tmp-XXXXXXXX``, same folder,
hence same filesystem), flushed to the disk (``fsync`` of every file and folder, so that a
full disk or an I/O error that the filesystem only reports on flush is seen *before* anything
is replaced), and then renamed into place:

- a new path: one ``rename``;
- an existing file: one ``os.replace`` (atomic);
- an existing folder: ``renameat2(RENAME_EXCHANGE)`` swaps the two folders in one atomic step
  (Linux >= 3.15, most local filesystems); where the filesystem lacks it, two renames via a
  ``.NAME.old-XXXXXXXX`` sibling, the old one put back if the second fails.

Any error removes the temporary sibling and leaves ``path`` as it was. Only a process killed
in the middle (SIGKILL, power loss) can leave a ``.NAME.tmp-*`` sibling behind; ``path`` itself
is then still the old version.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

__all__ = [
    "consolidated_metadata",
    "new_directory",
    "replacement",
    "replace_atomically",
    "write_dataset",
]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# errors meaning "this system or filesystem cannot exchange": fall back to two renames
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}


def _sibling(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with suppress(FileNotFoundError):
            path.unlink()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush every file under ``path`` (or the file ``path``), then the folders, to the disk."""
    if path.is_file():
        _fsync_file(path)
        return
    for folder, _, files in os.walk(path, topdown=False):
        for name in files:
            _fsync_file(Path(folder, name))
        _fsync_dir(Path(folder))


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically; ``False`` when the system or filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def replace_atomically(new: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Put the file or folder ``new`` at ``target`` (existing or not) in one visible step.

    ``new`` must be on the same filesystem as ``target`` (a sibling). Afterwards ``new`` no
    longer exists; an old ``target`` is removed. On error ``target`` is unchanged.
    """
    new, target = Path(new), Path(target)
    if not target.exists() and not target.is_symlink():
        os.rename(new, target)
    elif target.is_dir() and not target.is_symlink():
        if _exchange(new, target):
            _remove(new)  # now the old version
        else:
            old = _sibling(target, "old")
            os.rename(target, old)
            try:
                os.rename(new, target)
            except BaseException:
                os.rename(old, target)
                raise
            _remove(old)
    else:
        os.replace(new, target)
    _fsync_dir(target.parent)


@contextmanager
def consolidated_metadata() -> Iterator[None]:
    """Silence, inside the block only, zarr 3's warning that consolidated metadata is not (yet)
    part of the v3 specification.

    The package writes consolidated metadata on purpose: xarray and zarr-python read it, and
    without it every ``xarray.open_zarr`` of a result or a simulated store warns instead (and
    lists every folder). Only that one message is filtered, only while the package writes.
    """
    from zarr.errors import ZarrUserWarning

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="Consolidated metadata is currently not part",
            category=ZarrUserWarning,
        )
        yield


@contextmanager
def replacement(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling folder to fill; when the block succeeds it replaces ``path``
    (existing or not) in one atomic step (:func:`replace_atomically`).

    The folder is not created. On error it is removed and ``path`` is left as it was.
    """
    with _filled_sibling(path, replace_atomically) as tmp:
        yield tmp


@contextmanager
def new_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling folder to fill; it becomes ``path`` when the block succeeds.

    The folder is not created (the writer creates it, e.g. ``zarr.open_group(tmp, mode="w-")``).
    On success it is flushed and renamed to ``path``, which must not exist (else
    ``FileExistsError``); on error it is removed and ``path`` is left as it was.
    """

    def rename_new(tmp: Path, target: Path) -> None:
        if target.exists():
            raise FileExistsError(errno.EEXIST, "path appeared while it was being created", path)
        os.rename(tmp, target)
        _fsync_dir(target.parent)

    with _filled_sibling(path, rename_new) as tmp:
        yield tmp


@contextmanager
def _filled_sibling(
    path: str | os.PathLike[str], install: Callable[[Path, Path], None]
) -> Iterator[Path]:
    """A temporary sibling folder of ``path`` to fill; when the block succeeds it is flushed and
    ``install(tmp, target)`` puts it in place. On any error it is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(target, "tmp")
    try:
        yield tmp
        _fsync_tree(tmp)
        install(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


def write_dataset(ds: Any, path: str | os.PathLike[str], overwrite: bool = False) -> None:
    """Write an ``xarray.Dataset`` atomically: ``*.nc`` as netCDF, anything else as zarr.

    A zarr store gets consolidated metadata (``xarray.open_zarr`` opens it without a warning).
    A drop-in for :func:`kelr_dist.pipeline.result.write_result`, adding the flush before the
    rename
    (a full disk seen by ``fsync`` fails the write, not the data) and the atomic exchange of an
    existing store (there is no moment without a result at ``path``).

    Raises
    ------
    ValueError
        ``path`` exists and ``overwrite`` is false.
    OSError
        The write failed (full disk, permissions, ...); ``path`` is as it was.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise ValueError(f"output {str(target)!r} exists; choose another path or overwrite")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(target, "tmp")
    try:
        # anything lazy is computed before the first byte is written: a failing task of a
        # parallel write would otherwise leave others running, and one of them could recreate
        # the temporary file after it was removed (seen once in CI, netCDF)
        ds = ds.compute()
        if target.suffix == ".nc":
            ds.to_netcdf(tmp)
        else:
            with consolidated_metadata():
                ds.to_zarr(tmp, mode="w", consolidated=True)
        _fsync_tree(tmp)
        replace_atomically(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
