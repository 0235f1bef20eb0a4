"""`kvbench-plan`: the largest batch and the first out-of-memory batch b0, predicted without weights.

Before renting GPUs, a researcher wants to know what batch a setting reaches. The planner answers it
from the same account the runs are budgeted with (kvbench.memory), on a node described in the config:

- the model is built on the **meta device** from its config (`ModelSpec`, each loader's weight-free
  twin: the paper's two models' config.json ship inside kvbench, so they plan offline; other Hub
  models read theirs from the Hub), so every parameter and buffer has its real shape and dtype and
  none has storage;
- its layers and weights are **placed per device by transformers' own `device_map="auto"` code**
  (`_get_device_map`: accelerate's balanced `max_memory`, then `infer_auto_device_map`) with the
  node's per-GPU memory, exactly as `from_pretrained` would place them; a loader that does not split
  (GGUF, tiny) puts everything on one device, as it does when it loads;
- the node: `plan.gpus` x `plan.gpu_mem_mib`, else the GPUs of `model.max_memory` (each capped at
  `memory.limit_gb` when set), else the CPU under the accounted `memory.limit_gb`; on every device
  `memory.reserve_gb` is taken off the memory limit (the CUDA context and allocator slack the account
  does not see);
- the prompts: the task's real prompt lengths (its tokenizer, `data.dir` or the Hub: the preflight's
  `prompt_lengths`), or every prompt `plan.prompt_tokens` long (the worst case; needed offline for the
  paper's models, whose tokenizers are on the Hub only);
- for each attention backend of `plan.backends` and each policy (ED at `reproduce.ed_kv_size`, the
  full cache, and the configured evicting policy at each of `plan.kv_sizes`), `kvbench.search.search`
  over `search.candidates` with a trial that admits a batch when every device's accounted peak of the
  worst-case batch (the b longest prompts, as the real search probes) fits its memory limit.

On the CPU this is the verdict `search.max_batch=true search.probe=account` reaches with the weights
loaded. It prints a table and appends one record with `mode: plan` to `results_dir/runs.jsonl`, built
by kvbench.run.record's `plan_record`.

One idea per module: node.py (the node), placement.py (the meta model placed per device), plan_prompts.py
(the prompt lengths), account.py (the policies and the account's trial), planner.py (the plan and its
record), plan_cli.py (the table and the command). `python -m kvbench.capacity` runs the command.
"""

from kvbench.capacity.account import headroom, plan_policies, trial, window_credit
from kvbench.capacity.node import MiB, Node, check, node_of
from kvbench.capacity.placement import placed_shape, placement, spec_of
from kvbench.capacity.plan_cli import main, preflight, table
from kvbench.capacity.plan_prompts import prompt_lengths
from kvbench.capacity.planner import plan, plan_inputs

__all__ = ["MiB", "Node", "check", "headroom", "main", "node_of", "placed_shape", "placement", "plan",
           "plan_policies", "plan_inputs", "preflight", "prompt_lengths", "spec_of", "table", "trial", "window_credit"]
