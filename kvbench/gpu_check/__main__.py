"""`python -m kvbench.gpu_check`: the same as the console script `kvbench-gpu-check`."""

from kvbench.gpu_check.gpu_cli import entry

entry()
