"""The batched greedy generator that runs a policy's evicting KV cache.

Rooms: `output` (GenerationOutput), `batch` (one batch's state: prompts, budgets, chunks, cache, its plan:
kvbench.batch_plan), `evictions` (the plan's actions before a forward, run on the cache), `loop` (prefill, decode,
`generate_batch`), `entry` (`generate`).

For each batch: right-pad the prompt ids on the CPU, allocate a `KVCache` sized by the batch's budgets (kvbench.budgets),
run the forwards of the batch's plan (kvbench.batch_plan: the prefill chunks of `schedule.prefill_chunks`,
then one token per decode step), each preceded by the evictions, window trims and resizes the plan puts before
it. Every forward gets explicit true `position_ids` (RoPE sees real positions after eviction) and prefill materialises no
logits except the last position's (`logits_to_keep=1`; intermediate chunks run the decoder only).

Memory: before each batch `generate` computes its accounted peak (`kvbench.memory.account`) and, with a
`memory_limit`, refuses a batch over it on CPU (`MemoryLimitExceeded`, an out-of-memory) before anything is
allocated. `decode_steps` stops a batch early (a memory probe: the cache is still sized for
`max_new_tokens`); `warmup` runs the first batch once, untimed, before the timed ones (CUDA's lazy initialisation,
cuBLAS's setup and flash-attn's first-call check are then not in the first batch's `prefill_s`; the runner
turns it on by default on CUDA). The batches' accounts are computed before the clock starts: `wall_s` is
generation only.

Query-agnostic runs (`question_tokens`: the last q_b tokens of each prompt are its question, kvpress's
protocol): the context (the prompt less its question) is prefilled under the schedule, then compressed
(before any forward of the question: after_prefill to its budget, the other schedules down to
min(kv_size - p, kv_size - q_b) so the question fits), then the question is prefilled as one more chunk
that is never evicted before the first generated token. Budgets come from the context's length; the
question is kept like generated tokens (capacity: context budget + question + new tokens under
after_prefill). The prompt ids are the query-aware run's, so the full cache gives the same tokens.

Timings: `prefill_s` covers the prompt forwards and their evictions, `decode_s` the rest; CUDA is
synchronised at each boundary. Inside them, `evict_s` (evictions, decode_only's resize) and
`attn_stats_s` (attention statistics of scored policies) are timed by `kvbench.timing` (CUDA events,
read after the final synchronisation: timing them adds no synchronisation to the loop). EOS handling matches `model.generate`: a finished sample keeps
running on pad tokens until the batch ends; with `ignore_eos` every sample generates
`max_new_tokens` tokens (the paper's protocol).

Host syncs: the decode loop waits for the device only to test whether every sample is done, once every
`EOS_CHECK_EVERY` steps (the steps run past the last EOS give pads, dropped like a finished sample's);
index tensors go to the device in non-blocking copies (kvbench.cache.layout.to_device) and scheduling reads
counts kept on the CPU, so the syncs per step depend neither on the policy nor on its groups of layers.
"""

from kvbench.engine.batch import Batch
from kvbench.engine.entry import encode, eos_ids, generate, pad_id
from kvbench.engine.evictions import execute
from kvbench.engine.loop import EOS_CHECK_EVERY, generate_batch
from kvbench.engine.output import GenerationOutput

__all__ = ["EOS_CHECK_EVERY", "Batch", "GenerationOutput", "encode", "eos_ids", "execute", "generate",
           "generate_batch", "pad_id"]
