"""Reading and writing in a folder anyone can write into: no link followed, nothing but a regular
file opened, nothing that blocks.

The snapshot folder is shared by every training job of a node, often by several users. What
one of them places there must not stop a reader, nor lead it elsewhere. Every reader of the
tree (the ingest, its start-up replay, /replay, the report, rebaseline, resume, the webhook's
pause record, the SDK's pause gate) opens through this module, by one rule (docs/security.md):

* **The tree's root is followed as given; nothing below it that is a link.** A symbolic link
  to a file or a folder is refused (``symlink``), wherever it points: inside the tree or out,
  dangling or looping. Every folder on the way down is opened relative to the one above it
  with ``O_NOFOLLOW``, so a folder swapped for a link between a check and a read cannot lead
  out of the tree either.
* **Only a regular file is read.** A FIFO, a socket or a device where a file should be is
  refused (``not_regular``). It is looked at (``lstat``) before it is opened, so a device is
  never opened; and the open itself cannot block: ``O_NONBLOCK`` (a FIFO opens at once,
  writer or not), ``O_NOCTTY``, and the file checked by ``fstat`` on the open descriptor, so
  what is read is what was checked.
* A file is written by a temporary file in its folder (opened the same way) and a rename:
  a reader sees the old content or the new, and a link or FIFO in the file's place is replaced,
  never written through.

A refusal is a ``Refused`` (an ``OSError``) carrying its reason, for the reader to count. Hard
links are the file itself, not a way out: the kernel's ``fs.protected_hardlinks`` keeps a user
from linking a file they may not read.

Standard library only: the SDK imports it inside the training loop's process.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["NOT_REGULAR", "REFUSALS", "SYMLINK", "Refused", "is_plain_folder", "lines", "open_regular",
           "printable", "read_regular", "replace_file", "walk"]

SYMLINK = "symlink"
NOT_REGULAR = "not_regular"
# Why a path is refused, and what it is: the readers count a refusal by this reason.
REFUSALS: dict[str, str] = {
    SYMLINK: "a symbolic link (to a file or a folder, inside the tree or out): links are never "
             "followed below the snapshot folder",
    NOT_REGULAR: "a FIFO, socket or device where a snapshot or control file should be",
}

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC


class Refused(OSError):
    """``path`` is no regular file of the tree (``reason``: SYMLINK or NOT_REGULAR); never read."""

    def __init__(self, path: str | os.PathLike[str], reason: str, what: str) -> None:
        super().__init__(errno.EPERM, what, os.fspath(path))
        self.reason = reason
        self.what = what


def printable(path: str | os.PathLike[str]) -> str:
    """A path as a log line can carry it: a name that is not UTF-8 (its bytes decoded by
    surrogateescape) shows its bytes as ``\\xff`` escapes instead of unencodable surrogates,
    which a UTF-8 log stream, file or report would refuse."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _parts(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> tuple[str, ...]:
    """``path`` as the names below ``root`` that lead to it (both as any path: absolute, or
    relative to the working folder); () for ``root`` itself. String work, not pathlib's: the
    ingest asks this for every file it reads."""
    base, target = os.path.abspath(root), os.path.abspath(path)
    if target == base:
        return ()
    prefix = base if base.endswith(os.sep) else base + os.sep
    if not target.startswith(prefix):
        raise ValueError(f"{path} is not below {root}")
    return tuple(target[len(prefix):].split(os.sep))


def _descend(fd: int, name: str, where: Path) -> int:
    """The folder ``name`` of the open folder ``fd``, opened without following a link."""
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:  # gone meanwhile
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(where)) from None
        if stat.S_ISLNK(mode):
            raise Refused(where, SYMLINK, "a symbolic link to a folder") from None
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(where)) from None


def _open_folder(root: Path, parts: tuple[str, ...]) -> int:
    """The folder ``root/parts...``: ``root`` followed as given, each part below it not."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    where = root
    try:
        for name in parts:
            where = where / name
            below = _descend(fd, name, where)
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_plain_folder(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder below ``root`` reached through no link. Raises Refused for a
    link on the way (a linked folder): the caller counts it; False for no folder at all."""
    try:
        os.close(_open_folder(Path(root), _parts(root, path)))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return False
    return True


def open_regular(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` (below ``root``), open for binary reading: a regular file reached through no
    link. Refused for a link or a FIFO, socket or device, without opening it or blocking;
    IsADirectoryError for a folder; the OSError of the open otherwise (FileNotFoundError,
    PermissionError, ...)."""
    parts = _parts(root, path)
    if not parts:
        raise ValueError(f"{path} is the tree's root, not a file in it")
    fd = _open_folder(Path(root), parts[:-1])
    try:
        name = parts[-1]
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise Refused(path, SYMLINK, "a symbolic link")
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise Refused(path, NOT_REGULAR, _kind(mode))
        try:
            file_fd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # swapped for a link since the look
                raise Refused(path, SYMLINK, "a symbolic link") from None
            raise
    finally:
        os.close(fd)
    try:
        mode = os.fstat(file_fd).st_mode
        if not stat.S_ISREG(mode):  # swapped since the look: what is open is what counts
            raise Refused(path, NOT_REGULAR, _kind(mode))
        # A regular file ignores O_NONBLOCK on Linux, but some network file systems honour it
        # for reads (EAGAIN); the open that it protected is done.
        os.set_blocking(file_fd, True)
        return os.fdopen(file_fd, "rb")
    except BaseException:
        os.close(file_fd)
        raise


def read_regular(root: str | os.PathLike[str], path: str | os.PathLike[str], limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``path`` (opened as ``open_regular`` does): more than
    ``limit`` says the file is larger than the caller takes."""
    with open_regular(root, path) as fh:
        return fh.read(limit + 1)


def replace_file(root: str | os.PathLike[str], path: str | os.PathLike[str],
                 data: bytes | Iterable[bytes], mode: int = 0o644) -> None:
    """Replace ``path`` (below ``root``) with ``data`` (bytes, or chunks of bytes written in
    turn, as a large file need not be joined in memory first) atomically: a reader sees the old content
    or the new, never half of one; whatever was there (a link, a FIFO) is replaced, not written
    through. The temporary file lies in the same folder (the rename stays on one file system),
    is a dotfile ending in ``.tmp`` (never a snapshot) of its own random name (two writers never
    share one), is created exclusively (never an existing file or a link), and is flushed to disk
    before it takes the name. ``mode`` whatever the umask: the trainer and the exporter may run as
    different users."""
    parts = _parts(root, path)
    if not parts:
        raise ValueError(f"{path} is the tree's root, not a file in it")
    folder = _open_folder(Path(root), parts[:-1])
    name = parts[-1]
    try:
        for _ in range(8):
            tmp = f".{name.lstrip('.')}.{secrets.token_hex(4)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC,
                             0o600, dir_fd=folder)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in (data,) if isinstance(data, bytes) else data:
                    fh.write(chunk)
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder)
            except OSError:
                pass
            raise
    finally:
        os.close(folder)


def lines(fh: BinaryIO, limit: int, last: bool = False) -> Iterator[tuple[int, bytes | None]]:
    """(offset, line without its newline) of each complete line of ``fh`` from where it stands,
    read ``limit`` bytes at most at a time: a line longer than ``limit`` is (offset, None), its
    bytes dropped up to its newline, so memory stays bounded whatever the file holds (a sparse
    file of NULs, a runaway writer). A last line without its newline is left out (being
    written), unless ``last`` (a finished file read after the fact)."""
    offset = fh.tell()
    skipping = False
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        start, offset = offset, offset + len(line)
        if not line.endswith(b"\n"):
            if len(line) > limit and not skipping:  # oversized: say so once, drop to its newline
                skipping = True
                yield start, None
            elif last and not skipping and len(line) <= limit:
                yield start, line
            continue  # or the last line, still being written
        if skipping:
            skipping = False
            continue
        yield start, line[:-1]


def walk(root: str | os.PathLike[str], start: str | os.PathLike[str] | None = None, *,
         descend: Callable[[str], bool] = lambda name: True,
         onerror: Callable[[Path, OSError], None] | None = None,
         ) -> Iterator[tuple[Path, list[os.DirEntry[str]]]]:
    """Each folder of the tree ``root`` from ``start`` (default: ``root``) down, as (its path,
    its entries), parents before children. A folder is entered only when it is one, not a link
    (a link's entry is listed, for the caller to count), and when ``descend(name)``; each is
    opened relative to its parent's descriptor without following a link (the descriptors of
    the folders on the way down stay open meanwhile: as many as the tree is deep). Ask an
    entry's ``is_dir()``, ``is_file()`` and ``stat()`` with ``follow_symlinks=False``:
    ``stat()`` then costs one ``lstat``, the others nothing; and only before the next folder is
    asked for (an entry reads its folder through the folder's descriptor). A folder that cannot
    be opened or listed goes to ``onerror`` (its path, the error) and is skipped; ``start``
    that is a link raises Refused."""
    first = Path(start) if start is not None else Path(root)

    def failed(folder: Path, exc: OSError) -> None:
        if onerror is not None and (exc.errno != errno.ENOENT or folder == first):
            onerror(folder, exc)

    def listing(folder: Path, fd: int) -> list[os.DirEntry[str]] | None:
        try:
            with os.scandir(fd) as it:
                return list(it)
        except OSError as exc:
            failed(folder, exc)
            return None

    def below(entries: list[os.DirEntry[str]]) -> Iterator[str]:
        return iter([e.name for e in entries if e.is_dir(follow_symlinks=False) and descend(e.name)])

    try:
        fd = _open_folder(Path(root), _parts(root, first))
    except Refused:
        raise
    except OSError as exc:
        failed(first, exc)
        return
    stack: list[tuple[Path, int, Iterator[str]]] = []
    try:
        entries = listing(first, fd)
        stack.append((first, fd, below(entries or [])))
        if entries is None:
            return
        yield first, entries
        while stack:
            folder, fd, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            path = folder / name
            try:
                child = _descend(fd, name, path)
            except Refused:
                continue  # swapped for a link since it was listed: the next listing counts it
            except OSError as exc:
                failed(path, exc)
                continue
            entries = listing(path, child)
            stack.append((path, child, below(entries or [])))
            if entries is not None:
                yield path, entries
    finally:
        for _, fd, _ in stack:
            os.close(fd)
