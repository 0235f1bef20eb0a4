"""Deprecated path (issue 35): the preflight lives in kvbench.config.preflight. `kvbench.preflight` is that very
module (not a copy), so code and tests that import or patch it here keep working. To be removed."""

import sys

from kvbench.config import preflight as _preflight

sys.modules[__name__] = _preflight
