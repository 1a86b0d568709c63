"""Where the backend keeps its tuning database: a directory that outlives the process, so a
model compiled once compiles again without tuning (every kernel a database hit).

Read without torch or TVM: the command line and the tests can ask where it is.
"""

from __future__ import annotations

import os
from pathlib import Path

#: moves the whole cache (the tuning database with it)
CACHE_ENV = "FASTDLIGHT_CACHE"


def cache_dir() -> Path:
    """``$FASTDLIGHT_CACHE`` if set, else ``$XDG_CACHE_HOME/fastdlight``, else
    ``~/.cache/fastdlight``. Not created here: only tuning on a GPU writes to it."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    # the XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "fastdlight"


def database_dir() -> Path:
    """The tuning database the backend reads and writes (``ApplyFastTuning(meta_database_dir=...)``):
    ``cache_dir() / "tuning"``."""
    return cache_dir() / "tuning"
