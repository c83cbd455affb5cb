"""The one base class for mistakes a user can fix.

Why a base class: the command line prints these as one line (``specchat: error: ...``, exit 2)
and lets every other exception surface with its traceback, because that one is our bug. The
engine raises them (a bad config, a model it cannot find, a broken checkpoint) and must not
import the app to do so, so the class lives here, below both.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input, a missing file, an unsupported model: the message says what to do."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk is full: an OSError with ENOSPC (or EDQUOT, a quota), or the
    plain Exception that libraries written in Rust (tokenizers, safetensors) raise with the OS's
    words in its message, which no ``except OSError`` catches."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc).lower()
    return "no space left" in text or "disk quota exceeded" in text
