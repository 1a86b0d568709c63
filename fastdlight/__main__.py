"""``python -m fastdlight``: the ``fastdlight`` command, as ``python -m fastdlight.cli``."""

import sys

from fastdlight.cli import entry

sys.exit(entry())
