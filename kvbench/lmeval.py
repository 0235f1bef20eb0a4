"""kvbench inside lm-evaluation-harness: the model `kvbench` (the optional extra `[lm-eval]`, lm_eval 0.4.x).

    kvbench-lm-eval --model kvbench --model_args model=smollm2-135m,policy=h2o,kv_size=256 \\
        --tasks TASKS --batch_size 8

`kvbench-lm-eval` is lm_eval's own command line with this module imported (lm_eval 0.4 has no plugin
entry points, so a bare `lm_eval` does not know the name; `import kvbench.lmeval` registers it in a
Python session for `lm_eval.simple_evaluate(model="kvbench", ...)`).

model_args (kvbench.lmeval_args): `model` a kvbench model config (kvbench/conf/model: smollm2-135m,
tiny-llama...), `policy` a policy config (full, h2o, batch_max...), `device`, `dtype`, `attention`
(gen.attention), `prefill_chunk`, `add_bos_token`, `max_gen_toks`, `prefix_token_id`; every other key is
that policy's (`kv_size=256`, `evict_every`, `schedule`, `compression_ratio`...). A bad one stops with one
line before the model loads: a ConfigError in Python, exit code 2 from `kvbench-lm-eval` (checked from the
command line before lm_eval starts).

Generation requests (`generate_until`) run through kvbench's engine at lm_eval's `--batch_size`, in the
order lm_eval gives them (left-padded batches, the policy evicting during prefill and decode as
configured), greedy only: a task asking for sampling is refused. A request generates its `max_gen_toks`
(or lm_eval's aliases `max_new_tokens`, `max_tokens`, `max_completion_tokens`), else the model_arg
`max_gen_toks`, lm_eval's 256 by default (as its HFLM); the generation is cut at the request's `until`
strings (and EOS). Log-likelihood requests (multiple choice) score the continuation against the compressed
cache of its context (kvbench.continuation: the context compressed as the policy's schedule leaves it, the
continuation read in full, never evicted); an empty context is conditioned on HFLM's `prefix_token_id`
(the model_arg, else the tokenizer's BOS, else its EOS). `loglikelihood_rolling` (perplexity) is refused
with one line; `kvbench-lm-eval` refuses it, and log-likelihood tasks with a policy that cannot score them, before
lm_eval starts (kvbench.lmeval_tasks).
"""

from __future__ import annotations

import sys

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # the extra is missing: one line saying how to get it
    raise ImportError("kvbench's lm-eval model needs lm_eval: pip install 'kvbench[lm-eval]'") from e

from kvbench.errors import ConfigError

ROLLING_REFUSED = ("kvbench: the lm-eval model 'kvbench' does not run loglikelihood_rolling (perplexity) tasks: "
                   "a rolling window over a compressed cache is not defined")
MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")  # lm_eval's order


@register_model("kvbench")
class KVBenchLM(LM):
    """lm_eval's model over kvbench's engine and one eviction policy."""

    def __init__(self, model: str = "smollm2-135m", policy: str = "full", batch_size: int | str = 1, **kw):
        super().__init__()
        from kvbench.config import build_policy
        from kvbench.lmeval_args import configure
        from kvbench.run.models import load_model

        setup = configure({"model": model, "policy": policy, "batch_size": batch_size, **kw})  # before any load
        self.cfg = setup.cfg
        self.policy = build_policy(self.cfg)
        self.batch_size, self.add_bos_token = setup.batch_size, setup.add_bos_token
        self._max_gen_toks, self.custom_prefix_token_id = setup.max_gen_toks, setup.prefix_token_id
        self.lm = load_model(self.cfg)
        self._device = str(self.lm.model.device)
        self.last_token_ids: list[list[int]] = []  # the last generate_until call's tokens (tests, debugging)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """lm_eval's --model_args as a string (`key=value,...`), with its own options (`from_lm_eval`)."""
        from lm_eval import utils

        return cls.create_from_arg_obj(utils.simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm_eval's model_args as a dict; batch_size, max_batch_size and device come from lm_eval's own options
        (kvbench.lmeval_args.from_lm_eval: in model_args they are refused)."""
        from kvbench.lmeval_args import from_lm_eval

        return cls(**from_lm_eval(arg_dict, additional_config))

    # ------------------------------------------------------------------ lm_eval's conventions (as its HFLM)
    @property
    def max_gen_toks(self) -> int:
        """Tokens a generation request makes unless it says: the model_arg, lm_eval's 256 by default."""
        return self._max_gen_toks

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is conditioned on: the model_arg, else the tokenizer's BOS, else its EOS."""
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        tok = self.lm.tokenizer
        return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return str(self.cfg.model.get("name", "kvbench")).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.lm.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.lm.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                     add_generation_prompt=add_generation_prompt)

    # ------------------------------------------------------------------ requests
    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm_eval's split: the context's trailing spaces go to the continuation; an empty context is
        `prefix_token_id` (or the continuation's first token, where that is the same token), as lm_eval's LM."""
        tok = self.lm.tokenizer
        if not context:
            cont = tok(continuation, add_special_tokens=False)["input_ids"]
            return ([self.prefix_token_id], cont) if cont[:1] != [self.prefix_token_id] else (cont[:1], cont[1:])
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation, context = context[-n_spaces:] + continuation, context[:-n_spaces]
        whole = tok(context + continuation, add_special_tokens=self.add_bos_token)["input_ids"]
        ctx = tok(context, add_special_tokens=self.add_bos_token)["input_ids"]
        return ctx, whole[len(ctx):]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """log P(continuation | context) with the context's cache compressed by the policy first, the
        continuation never evicted (kvbench.continuation), in lm_eval's order and batch size."""
        from kvbench.continuation import continuation_logprobs

        pairs = [self._encode_pair(*req.args) for req in requests]
        out = continuation_logprobs(self.lm.model, [c + x for c, x in pairs], [len(x) for _, x in pairs],
                                    self.policy, self.batch_size, prefill_chunk=self.cfg.gen.prefill_chunk,
                                    score_chunk=self.cfg.gen.score_chunk, attention=self.cfg.gen.attention,
                                    tokenizer=self.lm.tokenizer)
        for req, res in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(ROLLING_REFUSED)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy generations of every request, grouped by their generation settings, in lm_eval's order."""
        from kvbench import engine

        groups: dict[tuple, list[int]] = {}
        settings = []
        for i, req in enumerate(requests):
            context, gen = req.args[0], dict(req.args[1] or {})
            if gen.get("do_sample") or float(gen.get("temperature") or 0.0) > 0.0:
                raise NotImplementedError("kvbench: the lm-eval model 'kvbench' generates greedily only "
                                          f"(a request asks do_sample={gen.get('do_sample')}, "
                                          f"temperature={gen.get('temperature')})")
            until = gen.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(next((gen[k] for k in MAX_TOKEN_KEYS if gen.get(k) is not None), self.max_gen_toks))
            settings.append((context, until))
            groups.setdefault((tuple(until), max_new), []).append(i)
        outputs: list[str | None] = [None] * len(requests)
        tokens: list[list[int] | None] = [None] * len(requests)
        tok = self.lm.tokenizer
        for (until, max_new), idx in groups.items():
            ids = [tok(settings[i][0], add_special_tokens=self.add_bos_token)["input_ids"] for i in idx]
            out = engine.generate(self.lm.model, tok, ids, self.policy, self.batch_size, max_new_tokens=max_new,
                                  eos_token_ids=self.lm.eos_token_ids, prefill_chunk=self.cfg.gen.prefill_chunk,
                                  score_chunk=self.cfg.gen.score_chunk, attention=self.cfg.gen.attention,
                                  progress=not disable_tqdm)
            for i, gen_ids in zip(idx, out.token_ids, strict=True):
                eos = set(self.lm.eos_token_ids)
                upto = next((k for k, t in enumerate(gen_ids) if t in eos), len(gen_ids))
                text = tok.decode(gen_ids[:upto], skip_special_tokens=True)
                for stop in until:
                    if stop and stop in text:
                        text = text[: text.index(stop)]
                outputs[i], tokens[i] = text, gen_ids[:upto]
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        self.last_token_ids = tokens
        return outputs


def main() -> None:
    """`kvbench-lm-eval`: lm_eval's command line with the `kvbench` model registered; bad model_args (or
    batch size) for it, and tasks it cannot run with the policy (kvbench.lmeval_tasks), end the command with one
    line and exit code 2 before lm_eval starts."""
    from kvbench.config import build_policy
    from kvbench.lmeval_args import configure
    from kvbench.lmeval_command import command_line
    from kvbench.lmeval_tasks import command_types, refuse_unrunnable

    try:
        kwargs = command_line(sys.argv[1:])
        if kwargs is not None:
            policy = build_policy(configure(kwargs).cfg)
            refuse_unrunnable(policy, command_types(sys.argv[1:]))
    except ConfigError as e:
        print(f"kvbench-lm-eval: error: {e}", file=sys.stderr)
        sys.exit(2)
    from lm_eval.__main__ import cli_evaluate

    try:
        cli_evaluate()
    except (ConfigError, NotImplementedError) as e:
        print(f"kvbench-lm-eval: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
