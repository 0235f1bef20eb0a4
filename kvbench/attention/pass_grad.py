"""A scoring pass with autograd (`Needs.pass_grad`: KVgrad's input x gradient attribution), for the pass step
(kvbench.attention.pass_step) of the static engine and of serve mode alike.

The pass runs outside inference mode (the engine's forwards stay in it; the held pairs, inference tensors, are
only read: the keys and values concatenated with the pass's own are new tensors the graph saves), the model's
parameters frozen for the pass (gradients with respect to the activations only), the embeddings of the pass's ids
detached and requiring a gradient. The objective is kvpress's Phi = sum over the pass's tokens of ||h_L||^2, h_L
the last decoder layer's output before the final norm, in float32, over each row's real tokens only (a left pad
never reaches a real token: rows stay independent, Phi's gradient at a row is its own objective's). After
`Phi.backward()` each layer's ||dPhi / d attention output|| (the attention module's output, after o_proj; float32)
per token is handed to the step, which scores the layers one at a time, the graph freed.
"""

from __future__ import annotations

import torch

from kvbench.attention.interface import hook_attention


def _first(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def backward_pass(model, step, ids: torch.Tensor, pos: torch.Tensor, real: torch.Tensor, **decoder_kw) -> None:
    """One forward + backward of the decoder over `ids` (B, T) at `pos` (`decoder_kw`: a hybrid's pass cache,
    kvbench.attention.pass_cache), then `step.finish(grads)`: layer -> (B, T) float32 gradient norms of its attention
    output (0 at pads)."""
    decoder = model.get_decoder()
    outputs: dict = {}  # layer -> the attention module's output (B, T, hidden), its gradient retained
    last: list = []

    def keep_output(module, args, output):
        a = _first(output)
        a.retain_grad()
        outputs[module.layer_idx] = a

    def keep_last(module, args, output):
        last.append(_first(output))  # (B, T, hidden) before the final norm

    frozen = [p for p in model.parameters() if p.requires_grad]
    hooks = hook_attention(model, keep_output, pre=False)
    hooks.append(decoder.layers[-1].register_forward_hook(keep_last))
    try:
        with torch.inference_mode(False), torch.enable_grad():
            for p in frozen:
                p.requires_grad_(False)
            embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)  # (B, T, hidden)
            decoder(inputs_embeds=embeds, position_ids=pos, kvbench_step=step, **{"use_cache": False, **decoder_kw})
            weight = real.float()  # (B, T) a normal tensor (real may be an inference one): pads add nothing
            phi = (last[-1].float().square().sum(-1) * weight).sum()
            last.clear()
            phi.backward()
            del phi, embeds
            grads = {layer: a.grad.float().norm(dim=-1) if a.grad is not None else
                     torch.zeros(a.shape[:2], device=a.device) for layer, a in outputs.items()}  # (B, T) each
            outputs.clear()
            with torch.no_grad():
                step.finish(grads)
    finally:
        for h in hooks:
            h.remove()
        for p in frozen:
            p.requires_grad_(True)
