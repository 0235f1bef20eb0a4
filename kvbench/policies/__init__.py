"""Eviction policies: one file per policy, each a dataclass that only computes a score."""

from kvbench.policies.base import SCHEDULES, Policy, ScoreStats
from kvbench.policies.batch_max import BatchMax
from kvbench.policies.extreme_decode import ExtremeDecode
from kvbench.policies.full import Full
from kvbench.policies.h2o import H2O
from kvbench.policies.keydiff import KeyDiff
from kvbench.policies.knorm import Knorm
from kvbench.policies.pyramidkv import PyramidKV
from kvbench.policies.random import Random
from kvbench.policies.snapkv import SnapKV
from kvbench.policies.streaming_llm import StreamingLLM
from kvbench.policies.tova import TOVA
from kvbench.policies.window import Window

__all__ = ["SCHEDULES", "Policy", "ScoreStats", "Full", "Window", "ExtremeDecode", "BatchMax", "H2O", "TOVA",
           "Knorm", "KeyDiff", "Random", "SnapKV", "PyramidKV", "StreamingLLM", "registry"]


def registry() -> dict[str, type[Policy]]:
    """Policy name -> class, for every policy defined in this package."""
    out, stack = {}, [Policy]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            out[sub.name] = sub
            stack.append(sub)
    return out
