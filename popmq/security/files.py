"""Owner-only files: what a server writes, and what it reads secrets from.

A broker's data directory holds message bodies in clear and the receipt-handle keys, so every
file and directory a server process creates is its owner's only: `popmq broker` and `popmq
serve` set the process umask to 0o077 at start (new directories 0700, files 0600), which
covers every writer at once (commit log, index, metadata, state, quarantine, keys) instead of
a mode argument each writer could forget.

A data directory made before (0755 under the usual umask) is reported once at start, not
changed: something else (a backup job) may rely on reading it.

Files holding secrets (the ACL, the cluster token, the handle keys) are checked once at start:
one readable by others gets a WARNING naming the file and its mode (never its content). Group
read is accepted only when it is how this process reads the file: a file owned by someone
else whose group is ours, as Kubernetes mounts Secrets (root, group fsGroup, 0440).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

OWNER_ONLY_UMASK = 0o077
_warned: set[str] = set()  # once per file and process (a file may be read at every reload)


def owner_only_new_files() -> int:
    """Make every file and directory this process creates from now on owner-only; returns
    the previous umask."""
    return os.umask(OWNER_ONLY_UMASK)


def warn_if_data_exposed(data_dir: str | Path) -> bool:
    """One WARNING when an existing data directory is open to others (message bodies)."""
    return warn_if_exposed(
        data_dir,
        "data directory",
        "it holds message bodies; chmod -R go= it (popmq creates new ones 0700)",
    )


def exposure(path: str | Path) -> str | None:
    """Who else may read a secret file ("everyone", "its group"), or None (owner only, or
    unreadable: the reader reports that itself)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_mode & (stat.S_IROTH | stat.S_IWOTH):
        return "everyone"
    if st.st_mode & (stat.S_IRGRP | stat.S_IWGRP):
        ours = {os.getgid(), *os.getgroups()}
        if st.st_uid == os.geteuid() or st.st_gid not in ours:
            return "its group"
    return None


SECRET_ADVICE = (
    "it holds secrets; make it 0600 (chmod 600, or a Secret volume with defaultMode 0440 and "
    "fsGroup)"
)


def warn_if_exposed(path: str | Path, what: str, advice: str = SECRET_ADVICE) -> bool:
    """One WARNING (once per file) when a secret file is readable by others; True if it is."""
    who = exposure(path)
    if who is None:
        return False
    if str(path) in _warned:
        return True
    _warned.add(str(path))
    mode = stat.S_IMODE(os.stat(path).st_mode)
    log.warning("%s %s is readable by %s (mode %04o): %s", what, path, who, mode, advice)
    return True
