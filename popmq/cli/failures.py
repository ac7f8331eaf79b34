"""Turning what goes wrong on a user's side into one line on stderr (exit status 2).

A taken port, a data directory another process holds, a bad config value, a missing file or an
unreachable endpoint is the user's to fix: they get one readable line, not a traceback.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re

import yaml
from pydantic import ValidationError

from popmq.config import ConfigEnvError, ConfigFileError
from popmq.errors import PopmqError
from popmq.tracing import TracingUnavailable

USER_ERROR_EXIT = 2

_BIND_FAILED = re.compile(r"Failed to bind to address (\S+?);?\s")


class UserError(Exception):
    """A problem the user can fix; the message is the whole story."""


def user_message(error: BaseException) -> str | None:
    """The one-line message for a user's error, or None when `error` is a bug."""
    if isinstance(error, UserError | TracingUnavailable):
        return str(error)
    if isinstance(error, ValidationError):
        return "bad config: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
            for e in error.errors(include_url=False)
        )
    if isinstance(error, yaml.YAMLError):
        return f"bad config file: {str(error).splitlines()[0]}"
    if isinstance(error, FileNotFoundError):
        return f"no such file: {error.filename}"
    if isinstance(error, PermissionError):
        return f"permission denied: {error.filename}"
    if isinstance(error, OSError) and error.strerror:
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror}{where}"
    if isinstance(error, PopmqError):
        return error.message
    if isinstance(error, RuntimeError):
        match = _BIND_FAILED.search(str(error) + " ")
        if match:
            return f"cannot listen on {match.group(1)}: address in use or not available"
    if isinstance(error, ConfigFileError | ConfigEnvError):
        return str(error)
    return None
