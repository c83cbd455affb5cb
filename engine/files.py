"""Reading a file the user named: a regular file only, and never more than a bound.

Why one reader: ``Path.read_text`` on a named pipe blocks until a writer comes (none will), and on
``/dev/zero`` reads until memory runs out; a settings file, a prompt set, a token map or a model's
config.json named by mistake (a FIFO, a device, a weights file) must be refused in one line
instead. The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` on that descriptor, so
even a path swapped for a FIFO between a stat and the open cannot block; then at most ``limit``
bytes are read (one more, to see a file that is bigger than it said).

Errors: :class:`~engine.errors.MissingFileError` for a missing path (a FileNotFoundError),
``IsADirectoryError`` for a folder (callers word that themselves: "name a file in it"), and
:class:`NotRegularFileError` / :class:`FileTooLargeError` (both :class:`UnreadableFileError`, a
UserError of one line naming the file) for the rest. Other OSErrors (permissions) pass through for the caller to word.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path

from engine.errors import MissingFileError, UserError

MiB = 2**20
SMALL_LIMIT = 1 * MiB  # a settings file, the UI config, a head's or a model's config.json: a few KB
JSON_LIMIT = 64 * MiB  # a token map, a tokenizer's side files, a weight index
TOKENIZER_LIMIT = 512 * MiB  # tokenizer.json: tens of MB for a 256k vocabulary
JSONL_LIMIT = 1024 * MiB  # a prompt set, a recorded trace, a saved conversation


class UnreadableFileError(UserError):
    """A path we will not read; the message names it and says why, in one line."""


class NotRegularFileError(UnreadableFileError):
    """A path that names a named pipe, a device or a socket, where a file was wanted."""


class FileTooLargeError(UnreadableFileError):
    """A file bigger than what the kind of file it should be could hold."""


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a named pipe", "a device")."""
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def size_words(n: int) -> str:
    """``n`` bytes for a message: "1 MiB", "21.4 MiB", "512 bytes"."""
    if n < MiB:
        return f"{n:,} bytes" if n < 1024 else f"{n / 1024:.3g} KiB"
    return f"{n / MiB:.3g} MiB"


def open_regular(path: str | Path, *, what: str = "a file") -> int:
    """A read-only descriptor for ``path``, which must be a regular file; the caller closes it.

    Opened without blocking (a FIFO opens at once this way), checked on the descriptor itself,
    then switched back to blocking reads. ``what`` names the file wanted in the refusal ("a
    settings file"). Raises as the module docstring says."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if p.is_symlink():
            raise MissingFileError(f"{p}: a symbolic link to {os.readlink(p)}, which does not exist") from None
        raise MissingFileError(f"{p}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise MissingFileError(f"{p}: a symbolic link that loops back on itself; fix the link") from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO some kernels refuse to open this way
            raise NotRegularFileError(f"{p}: not a regular file; name {what}") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(p))
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{p}: not a regular file ({file_kind(mode)}); name {what}")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | Path, *, what: str = "a file") -> None:
    """Refuse ``path`` unless it is a regular file, without reading it: for files a library opens
    itself (weights through safetensors or numpy, tokenizer.json through tokenizers), where
    handing it a FIFO would block inside the library."""
    os.close(open_regular(path, what=what))


def read_bytes(path: str | Path, *, limit: int, what: str = "a file") -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (FileTooLargeError above)."""
    fd = open_regular(path, what=what)
    with open(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(f"{path}: over {size_words(limit)}, too big to be {what}; check the path")
    return data


def read_text(path: str | Path, *, limit: int, what: str = "a file", errors: str = "strict") -> str:
    """The UTF-8 text of ``path`` (see :func:`read_bytes`), newlines read as ``Path.read_text`` reads
    them (\\r\\n and \\r as \\n); UnicodeDecodeError where it is not UTF-8 (``errors="replace"``
    keeps going instead)."""
    data = read_bytes(path, limit=limit, what=what)
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors=errors).read()
