"""One string per distinct name or header value a held call keeps.

protobuf (and gRPC's metadata) make a new string at each read, and a held long poll keeps its
group, topic, filter, broker and its client's headers for its whole wait: one string each,
shared by every poll that carries it, instead of a copy per held poll. Bounded, not
``sys.intern``: interned strings may be immortal (Python 3.12), and these come from strangers.
"""

from __future__ import annotations

_SHARED: dict[str, str] = {}
SHARED_NAMES_MAX = 16_384
SHARED_NAME_CHARS = 256


def shared_name(name: str) -> str:
    """``name``, or the equal string seen before. At most SHARED_NAMES_MAX strings of up to
    SHARED_NAME_CHARS are kept, forgotten at once past that."""
    kept = _SHARED.get(name)
    if kept is not None:
        return kept
    if len(name) <= SHARED_NAME_CHARS:
        if len(_SHARED) >= SHARED_NAMES_MAX:
            _SHARED.clear()
        _SHARED[name] = name
    return name
