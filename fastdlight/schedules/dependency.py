"""Where a kernel lets the next kernel on the stream start.

Kernels fastdlight builds for sm_90+ are launched as programmatic dependents
(:mod:`fastdlight.compiler.dependent_launch`): the next kernel's CTAs are placed once every CTA of
this kernel has exited or released its dependents (``griddepcontrol.launch_dependents``), and
they wait in ``griddepcontrol.wait`` until this kernel has completed. A template marks with
:func:`release_dependents` the point from which the next kernel may take the SMs' free slots:
where only a few CTAs still work. The split-KV decode step releases in the CTA that merges a
head's chunks, whose siblings have left: the next kernel is placed while the 32 merges of B1
H32 run (H200, 2026-11-30: 19.6 against 20.0 us). Released earlier, while the grid still
streams, the next kernel's CTAs took the free slots SM by SM and then ran on a part of the GPU
(released after each CTA's main loop: 0.95x torch instead of 1.09x; right after the wait:
0.79x), so nothing else releases early.

The build pass turns the marker into ``launch_dependents`` for a kernel it launches as a
dependent and drops it otherwise (sm_80, dependent launch switched off, or
``FASTDLIGHT_EARLY_RELEASE=0`` for an A/B).
"""

from __future__ import annotations

import os

from tvm import tirx
from tvm.script import tirx as T

#: attribute key of the marker (an AttrStmt the build pass replaces)
RELEASE = "fastdlight.release_dependents"
#: ``FASTDLIGHT_EARLY_RELEASE=0``: every kernel releases its dependents only by exiting
RELEASE_EARLY = os.environ.get("FASTDLIGHT_EARLY_RELEASE", "1") != "0"


def release_dependents():
    """``with release_dependents(): T.evaluate(0)``: the next kernel on the stream may be placed
    once every CTA of this one has passed here or exited."""
    return T.attr(tirx.const(0, "int32"), RELEASE, tirx.const(1, "int32"))
