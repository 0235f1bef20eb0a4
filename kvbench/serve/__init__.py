"""Serving mode (`kvbench mode=serve`): eviction policies inside a continuous-batching engine.

One idea per file, nano-vllm style:
    request.py    a request's state (tokens, cursor, block table, timings)
    blocks.py     the block manager: only counts and hands out block ids
    scheduler.py  continuous batching: admission, chunked prefill, preemption, how many blocks to evict
    evict.py      block-granular eviction: the evictable area and block scores from a policy's score()
    pool.py       the paged KV pool and one forward's layout (which slots each token writes and reads)
    attention.py  attention over pages, registered with transformers, active only inside a context
    runner.py     the model runner: one forward over a mix of prefill chunks and decode rows
    engine.py     the loop: arrivals -> schedule -> run -> sample -> finish; timeline and timings
    workload.py   requests from a task's prompts, seeded Poisson arrivals
    metrics.py    requests/s, tok/s, TTFT/TPOT percentiles, the utilisation plot
    run.py        one serve run -> one record (`mode: serve`), called by kvbench.runner
"""
