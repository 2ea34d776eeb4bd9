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

A new path is created only if nothing appeared there meanwhile (``renameat2(RENAME_NOREPLACE)``,
or a hard link for a file, where the filesystem lacks it): of two writers creating the same path
at the same time one wins, the other gets :class:`OutputExists` and leaves nothing.

Any error removes the temporary sibling and leaves ``path`` as it was. Only a process killed
in the middle (SIGKILL, power loss) can leave a ``.NAME.tmp-*`` sibling behind; ``path`` itself
is then still the old version. The sibling's name carries its writer (``.NAME.tmp-PID@HOST-X``):
the next write to the same path removes it once that process is gone.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
import socket
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

__all__ = [
    "OutputExists",
    "consolidated_metadata",
    "create_atomically",
    "new_directory",
    "remove_stale",
    "replacement",
    "replace_atomically",
    "write_dataset",
    "write_datasets",
]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
# errors meaning "this system or filesystem cannot exchange": fall back to two renames
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}


class OutputExists(FileExistsError):
    """Another writer created the output first; this one wrote nothing there."""


def _sibling(path: Path, tag: str) -> Path:
    """A fresh hidden sibling ``.NAME.TAG-PID@HOST-XXXXXXXX`` of ``path`` (its writer named)."""
    owner = f"{os.getpid()}@{socket.gethostname()}"
    return path.with_name(f".{path.name}.{tag}-{owner}-{uuid.uuid4().hex[:8]}")


def _writer_gone(owner: str) -> bool:
    """Whether the writer ``PID@HOST`` of a temporary sibling is a process of this host that no
    longer runs (another host's writer, or an unreadable owner, is never presumed gone)."""
    pid, _, host = owner.partition("@")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        pass
    return False


def remove_stale(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary siblings ``.NAME.tmp-*`` of ``path`` left by writers (of this host)
    that were killed; returns what was removed. A sibling whose writer still runs is kept."""
    target = Path(path)
    prefix = f".{target.name}.tmp-"
    removed = []
    for tmp in target.parent.glob(f"{glob.escape(prefix)}*"):
        owner = tmp.name[len(prefix) :].rpartition("-")[0]
        if _writer_gone(owner):
            _remove(tmp)
            removed.append(tmp)
    return removed


def _fresh_sibling(target: Path) -> Path:
    """The temporary sibling of a new write to ``target``, stale ones of killed writers
    removed first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    return _sibling(target, "tmp")


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


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """``renameat2(a, b, flags)``; ``False`` when the system or filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically; ``False`` when the system or filesystem cannot."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _appeared(target: Path) -> OutputExists:
    return OutputExists(
        f"output {str(target)!r} was created by another writer while this one was writing; "
        "it was left as that writer made it, and nothing was written"
    )


def create_atomically(new: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Put the file or folder ``new`` at ``target``, which must not exist, in one step that
    fails if ``target`` appeared meanwhile (``renameat2(RENAME_NOREPLACE)``; where the
    filesystem lacks it, a hard link for a file, a rename for a folder, which fails onto a
    non-empty folder).

    Raises
    ------
    OutputExists
        ``target`` exists; ``new`` is left as it was.
    """
    new, target = Path(new), Path(target)
    try:
        created = _renameat2(new, target, _RENAME_NOREPLACE)
        if not created and new.is_dir():
            if target.exists() or target.is_symlink():
                raise FileExistsError(errno.EEXIST, "exists", str(target))
            os.rename(new, target)
        elif not created:
            os.link(new, target)
            new.unlink()
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise _appeared(target) from None
        raise
    _fsync_dir(target.parent)


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
    :class:`OutputExists`, a ``FileExistsError``: :func:`create_atomically`); on error it is
    removed and ``path`` is left as it was.
    """

    with _filled_sibling(path, create_atomically) as tmp:
        yield tmp


@contextmanager
def _filled_sibling(
    path: str | os.PathLike[str], install: Callable[[Path, Path], None]
) -> Iterator[Path]:
    """A temporary sibling folder of ``path`` to fill; when the block succeeds it is flushed and
    ``install(tmp, target)`` puts it in place. On any error it is removed."""
    target = Path(path)
    tmp = _fresh_sibling(target)
    try:
        yield tmp
        _fsync_tree(tmp)
        install(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


def write_dataset(ds: Any, path: str | os.PathLike[str], overwrite: bool = False) -> None:
    """Write an ``xarray.Dataset`` atomically: ``*.nc`` as netCDF, anything else as zarr.

    The one-path case of :func:`write_datasets`.
    """
    write_datasets(ds, [path], overwrite)


def write_datasets(
    ds: Any, paths: Sequence[str | os.PathLike[str]], overwrite: bool = False
) -> None:
    """Write an ``xarray.Dataset`` to every one of ``paths`` (``*.nc`` as netCDF, anything else
    as zarr), all or nothing, each atomically.

    Every output is first written and flushed to a temporary sibling (a full disk or an I/O
    error that the filesystem reports only on flush fails here, before anything is replaced);
    only when all succeeded are they put in place: new paths first
    (:func:`create_atomically`, so a path another writer created meanwhile is not replaced,
    and the ones created before it are removed again), then existing ones when ``overwrite``
    (:func:`replace_atomically`: an existing store is exchanged in one step, so there is no
    moment without a result at a path). A zarr store gets consolidated metadata
    (``xarray.open_zarr`` opens it without a warning).

    Raises
    ------
    ValueError
        a path exists and ``overwrite`` is false.
    OutputExists
        another writer created a path meanwhile (a ``FileExistsError``).
    OSError
        a write failed (full disk, permissions, ...; the message names the path); every
        path is as it was.
    """
    targets = [Path(p) for p in paths]
    for target in targets:
        if target.exists() and not overwrite:
            raise ValueError(f"output {str(target)!r} exists; choose another path or overwrite")
    staged: list[tuple[Path, Path]] = []
    created: list[Path] = []
    try:
        # anything lazy is computed before the first byte is written: a failing task of a
        # parallel write would otherwise leave others running, and one of them could recreate
        # the temporary file after it was removed (seen once in CI, netCDF)
        ds = ds.compute()
        for target in targets:
            tmp = _fresh_sibling(target)
            staged.append((tmp, target))
            _write_one(ds, tmp, target)
        # new paths first: a lost race is the only failure left, and it is undone
        replaced = {t for _, t in staged if overwrite and (t.exists() or t.is_symlink())}
        staged.sort(key=lambda pair: pair[1] in replaced)
        for tmp, target in staged:
            if target in replaced:
                replace_atomically(tmp, target)
            else:
                create_atomically(tmp, target)
                created.append(target)
    except BaseException:
        for target in created:
            _remove(target)
        for tmp, _ in staged:
            _remove(tmp)
        raise


def _write_one(ds: Any, tmp: Path, target: Path) -> None:
    """``ds`` written and flushed to ``tmp`` (netCDF when ``target`` ends in ``.nc``, else zarr);
    an ``OSError`` that names no file, or the temporary one, names ``target`` instead, and so
    does the netCDF library's own error (a ``RuntimeError`` ``"NetCDF: ..."`` without an
    errno, e.g. for a full disk), raised as an ``OSError`` (EIO)."""
    try:
        if target.suffix == ".nc":
            ds.to_netcdf(tmp)
        else:
            with consolidated_metadata():
                ds.to_zarr(tmp, mode="w", consolidated=True)
        _fsync_tree(tmp)
    except OSError as err:
        unnamed = err.filename is None or str(err.filename).startswith(str(tmp))
        if unnamed and err.errno is not None:
            raise type(err)(err.errno, f"{err.strerror} (writing {target})") from err
        raise
    except RuntimeError as err:
        if not str(err).startswith("NetCDF:"):
            raise
        raise OSError(
            errno.EIO,
            f"the netCDF library failed ({err}): a full disk, a file-size limit or an I/O "
            f"error (writing {target})",
        ) from err
