"""Where a warning should point: at the code that called into fastdlight, not at our own line.

A fixed ``stacklevel`` is right for one call path only: ``fastdlight.tune``, ``apply_and_build``
and ``export`` reach the same warning through different depths. This module sits on the lowest
floor so that every floor can use it.
"""

from __future__ import annotations

import os
import sys

#: the package's folder: frames of files under it are ours
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def caller_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by the function that calls this,
    name the first frame outside fastdlight (the outermost frame when all of them are ours, as
    under the command line, which prints the message only)."""
    frame = sys._getframe(1)  # the function that will call warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
