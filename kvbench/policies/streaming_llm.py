"""StreamingLLM (Xiao et al., 2024): a sliding window plus 4 attention-sink pairs (the first positions).

A named `window` so records read as StreamingLLM. Published: one pair per token, positions re-indexed
inside the cache (policy.rerotate=true does that); departures are listed in `extensions`.
"""

from dataclasses import dataclass
from typing import ClassVar

from kvbench.policies.window import Window


@dataclass
class StreamingLLM(Window):
    kv_size: int | None = 256
    evict_every: int = 64
    protect_first: int = 4
    name: ClassVar[str] = "streaming_llm"
    label: ClassVar[str] = "StreamingLLM"
    summary: ClassVar[str] = "4 attention-sink pairs and the newest ones"
    paper: ClassVar[tuple[str, str]] = ("Xiao et al., ICLR 2024", "https://arxiv.org/abs/2309.17453")
    published_evict_every: ClassVar[int] = 1

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        # its own sinks, and re-rotation is what StreamingLLM publishes
        ext = [e for e in d["extensions"] if e != "protect_first=4" and not e.startswith("rerotate:")]
        if not self.rerotate:
            ext.append("source positions kept (published re-indexes positions in the cache: policy.rerotate=true)")
        d["extensions"] = ext
        return d
