"""``python -m fastdlight.cli``: the ``fastdlight`` command."""

import sys

from fastdlight.cli import entry

sys.exit(entry())
