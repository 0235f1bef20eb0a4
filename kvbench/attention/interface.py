"""kvbench's attention function, its registration with transformers, and the context that activates it.

`kvbench_attention` is registered with transformers' `AttentionInterface` under `NAME` (and a mask function
returning None under the same name: what each query sees comes with the forward's step). It reads nothing but its
arguments: every forward that runs through it passes ONE object, the keyword `kvbench_step`, whose `attend`
computes the layer's attention (`kvbench.attention.static_step.StaticStep` over the static engine's cache, serve mode's
`PagedStep` over its paged pool): the layout (write slots, masks, keys), the statistics sink, the backend and the
query chunk travel with the forward, so no setting lives in a module and two runs never share one. Called without
a step (outside kvbench's engines) it behaves like SDPA.

`kv_attention(model)` switches `model` to it inside the block and restores the model's own implementation on exit,
normal or by an exception; with `hidden=True` it also registers, on each attention module, a forward pre-hook that
hands the layer's input hidden states to the forward's step (`step.hidden(layer, hidden_states)`), for policies that
declare they read them, removed on exit. Registering the name is idempotent and changes no model.
"""

from __future__ import annotations

import contextlib

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

NAME = "kvbench"
SCORE_CHUNK = 64  # queries per chunk when computing attention weights for scores


def kvbench_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface entry: query (B, Hq, T, D), key/value (B, H_kv, N, D) = the pairs the cache returned.

    Returns the output (B, T, Hq, D) and None (no weights: statistics go to the step's sink)."""
    step = kwargs.get("kvbench_step")
    if step is None:  # called outside kvbench's engines: behave like SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    return step.attend(module, query, key, value, scaling, kwargs), None


def _no_mask(*args, **kwargs):
    return None  # the step carries its own masks


def register() -> None:
    """Make the name "kvbench" known to transformers (idempotent; changes no model)."""
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, kvbench_attention)
        AttentionMaskInterface.register(NAME, _no_mask)


def _hand_hidden(module, args, kwargs):
    """Forward pre-hook of an attention module: its input hidden states (B, T, h) to the forward's step."""
    step = kwargs.get("kvbench_step")
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    if step is not None and hidden is not None:
        step.hidden(module.layer_idx, hidden)


def attention_modules(model) -> list:
    """Each decoder layer's attention module (`self_attn`), in layer order; None at a layer that has none (a hybrid's
    linear-attention layer: no KV, nothing to score), so the list is indexed by layer all the same."""
    return [getattr(layer, "self_attn", None) for layer in model.get_decoder().layers]


def hook_attention(model, hook, pre: bool = True) -> list:
    """`hook` registered on every attention module (a forward pre-hook with kwargs, or a forward hook); the handles."""
    mods = [m for m in attention_modules(model) if m is not None]
    return [m.register_forward_pre_hook(hook, with_kwargs=True) if pre else m.register_forward_hook(hook) for m in mods]


@contextlib.contextmanager
def kv_attention(model, hidden: bool = False):
    """Run `model` with kvbench's attention inside the block (and, `hidden`, hand each attention module's input
    hidden states to the step); restore its implementation and remove the hooks after."""
    register()
    previous = model.config._attn_implementation
    hooks = hook_attention(model, _hand_hidden) if hidden else []
    try:
        model.set_attn_implementation(NAME)
        try:
            yield model
        finally:
            model.set_attn_implementation(previous or "sdpa")
    finally:
        for h in hooks:
            h.remove()
