"""The argparse parser of kvbench's flag-style commands (kvbench-needle, kvbench-report, kvbench-gpu-check).

Like every kvbench command, bad input ends it with one line, `<prog>: error: ...`, and exit code 2, before
anything loads (argparse's own refusal prints its usage first, several lines); `--help` is unchanged.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose `error` (a bad flag, a value of the wrong type, a caller's refusal) is one
    line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)
