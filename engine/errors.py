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
