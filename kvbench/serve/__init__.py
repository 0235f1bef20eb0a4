"""Serving mode (`kvbench mode=serve`): eviction policies inside a continuous-batching engine.

One idea per file, nano-vllm style:
    request.py    a request's state (tokens, cursor, block tables per (layer, KV head), budgets, timings)
    blocks.py     the block manager: only counts and hands out pages (one per layer and KV head)
    budgets.py    each request's budget per (layer, KV head), from its own prompt or given
    fit.py        whether a pool can ever hold a request, and whether its budget leaves room to run
    scheduler.py  continuous batching: admission, chunked prefill, preemption, how many blocks to evict
    block_evict.py  block-granular eviction: the evictable area and block scores from a policy's score()
    pool.py       the paged KV pool (pages of one layer and KV head)
    qpool.py      the paged pool with quantized K/V (gen.kv_cache_dtype): a page is a key group, a window per head
    page_layout.py  one forward's layout (which slots each token writes and reads, per layer and KV head)
    queries.py    each request's newest queries per layer (SnapKV, PyramidKV)
    observe.py    each request's observe-step state (per-pair statistics in its pages, per-row state)
    score_context.py  what a request's eviction hands the policy's score (ScoreContext from its pages)
    request_passes.py  a request's scoring passes at its compression point (KVzip), over its pages
    paged_attention.py  attention over pages, registered with transformers, active only inside a context
    model_runner.py  the model runner: one forward over a mix of prefill chunks and decode rows
    engine.py     the loop: arrivals -> schedule -> run -> sample -> finish; timeline and timings
    workload.py   requests from a task's prompts, seeded Poisson arrivals
    limits.py     OpenVINO's two cache limit checks (`mode=serve_limits`), on counts alone
    metrics.py    requests/s, tok/s, TTFT/TPOT percentiles, the utilisation plot
    run.py        one serve run -> one record (`mode: serve`), called by kvbench.run
"""
