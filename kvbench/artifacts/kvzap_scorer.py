"""KVzap's learned per-pair scorer (kvpress 0.5.5 `KVzapModel`), loaded from the Hub or a local folder.

KVzap (arXiv 2601.07891) scores each KV pair from the hidden state entering its layer's attention (after
`input_layernorm`, at the pair's own position): one module per layer, `Linear(hidden, H_kv)` ("linear") or
`Linear(hidden, hidden_dim) -> GELU (exact) -> Linear(hidden_dim, H_kv)` ("mlp"), predicting the log KVzip+
score of the pair for each KV head. The parameter names match kvpress's `KVzapModel` (`layers.{l}.weight`, or
`layers.{l}.0.*` / `layers.{l}.2.*`), so the published `model.safetensors` loads as is.
Hub layout (`nvidia/KVzap-{mlp|linear}-<model name>`): `config.json` (`model_type: "kvzap"`, `input_dim`,
`output_dim`, `n_modules`, `hidden_dim` (null = linear)) + `model.safetensors`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from torch import nn

from kvbench.errors import ConfigError

KEY = "policy.scorer"
TINY_WIDTH = 8  # a random MLP scorer's hidden width (tests, smoke runs); the published ones: 512
_ANSWERS: dict[str, bool] = {}  # whether the Hub answered, asked once per process


class KVzapScorer(nn.Module):
    """`n_modules` per-layer scorers, state-dict compatible with kvpress's `KVzapModel`."""

    def __init__(self, input_dim: int, output_dim: int, n_modules: int, hidden_dim: int | None = None):
        super().__init__()
        self.input_dim, self.output_dim, self.n_modules, self.hidden_dim = input_dim, output_dim, n_modules, hidden_dim

        def one() -> nn.Module:
            if hidden_dim is None:
                return nn.Linear(input_dim, output_dim)
            return nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, output_dim))

        self.layers = nn.ModuleList(one() for _ in range(n_modules))

    def score(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """kvpress's `KVzapPress.score`: hidden (B, T, hidden) -> scores (B, H_kv, T), in hidden's dtype."""
        module = self.layers[layer].to(hidden.device, dtype=hidden.dtype)
        return module(hidden).transpose(1, 2)  # (B, T, H_kv) -> (B, H_kv, T)

    def param_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of the weights held in `dtype`: L (hidden*hd + hd*H_kv) plus biases for the MLP; for an 8B model's
        MLP scorer (32 layers, 4096, 512, 8) about 134 MB in bfloat16 (the account: `module_params`)."""
        return sum(p.numel() for p in self.parameters()) * torch.empty((), dtype=dtype).element_size()

    def config(self) -> dict:
        """The `config.json` fields kvpress's `KVzapConfig` reads."""
        return {"model_type": "kvzap", "architectures": ["KVzapModel"], "input_dim": self.input_dim,
                "output_dim": self.output_dim, "n_modules": self.n_modules, "hidden_dim": self.hidden_dim}


def module_params(input_dim: int, output_dim: int, hidden_dim: int | None) -> int:
    """Parameters of one layer's module as `KVzapScorer` allocates it (nn.Linear weights and biases), for the memory
    account: hidden_dim None = linear."""
    if hidden_dim is None:
        return input_dim * output_dim + output_dim
    return input_dim * hidden_dim + hidden_dim + hidden_dim * output_dim + output_dim


def is_random(source: str | None, name_or_path: str) -> bool:
    """Whether `kvbench.policies.kvzap` builds a random scorer: `scorer=tiny`, or none given for a nameless model
    (kvbench's tiny random ones, for which nothing is published)."""
    return source == "tiny" or (source is None and not name_or_path)


@functools.cache
def scorer_width(source: str | None, model_type: str, name_or_path: str) -> int | None:
    """The hidden width of the scorer the policy loads (None: linear), from its config.json alone (no weights: the
    memory account and the planner read it): a random one's is TINY_WIDTH (mlp)."""
    if is_random(source, name_or_path):
        return None if model_type == "linear" else TINY_WIDTH
    source = source or hub_id(model_type, name_or_path)
    path = scorer_dir(source, ("config.json",)) / "config.json"
    if not path.is_file():
        raise ConfigError(KEY, "the scorer folder has no config.json", source)
    return json.loads(path.read_text()).get("hidden_dim")


def hub_id(model_type: str, name_or_path: str) -> str:
    """kvpress's repository name for a model's scorer: `nvidia/KVzap-{model_type}-<last path part>`."""
    if model_type not in ("linear", "mlp"):
        raise ConfigError(KEY, "KVzap's model_type is 'linear' or 'mlp'", model_type)
    return f"nvidia/KVzap-{model_type}-{name_or_path.rstrip('/').split('/')[-1]}"


def scorer_dir(source: str, files: tuple[str, ...] = ("config.json", "*.safetensors")) -> Path:
    """A local folder as is; otherwise a Hub repository id fetched with huggingface_hub (`files`: config + weights),
    from the local Hugging Face cache alone when HF_HUB_OFFLINE is set or the Hub does not answer in time."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    import huggingface_hub

    from kvbench.models.hub import HUB_TIMEOUT, offline
    from kvbench.net import answers

    local_only = offline() or not answers(huggingface_hub.constants.ENDPOINT, HUB_TIMEOUT, _ANSWERS)
    try:
        return Path(huggingface_hub.snapshot_download(
            source, allow_patterns=list(files), local_files_only=local_only))
    except Exception as e:  # not cached offline, unknown repository, gated
        where = "not in the local Hugging Face cache and the Hub cannot be reached" if local_only else \
            f"the Hub gave no scorer ({type(e).__name__})"
        raise ConfigError(KEY, f"no local folder; {where}", source) from None


def load_scorer(source: str, model_config=None) -> KVzapScorer:
    """The scorer at `source` (local folder or Hub id), checked against `model_config` (a transformers config:
    input_dim == hidden_size, output_dim == num_key_value_heads, n_modules == num_hidden_layers)."""
    from safetensors.torch import load_file

    folder = scorer_dir(source)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    for f in (cfg_path, weights):
        if not f.is_file():
            raise ConfigError(KEY, f"the scorer folder has no {f.name}", source)
    cfg = json.loads(cfg_path.read_text())
    missing = [k for k in ("input_dim", "output_dim", "n_modules") if k not in cfg]
    if missing:
        raise ConfigError(KEY, f"config.json lacks {missing}", source)
    if model_config is not None:
        want = {"input_dim": model_config.hidden_size, "output_dim": model_config.num_key_value_heads,
                "n_modules": model_config.num_hidden_layers}
        bad = {k: (cfg[k], v) for k, v in want.items() if cfg[k] != v}
        if bad:
            raise ConfigError(KEY, f"scorer does not fit the model (scorer, model): {bad}", source)
    scorer = KVzapScorer(cfg["input_dim"], cfg["output_dim"], cfg["n_modules"], cfg.get("hidden_dim"))
    state = load_file(str(weights))
    try:
        scorer.load_state_dict(state)
    except RuntimeError as e:
        raise ConfigError(KEY, f"weights do not match config.json: {str(e).splitlines()[0]}", source) from None
    return scorer.eval()


def save_scorer(scorer: KVzapScorer, folder: Path) -> Path:
    """Write `scorer` in the Hub layout (config.json + model.safetensors) into `folder`."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(scorer.config(), indent=2))
    save_file({k: v.contiguous() for k, v in scorer.state_dict().items()}, str(folder / "model.safetensors"))
    return folder


def tiny_scorer(model_config, hidden_dim: int | None = 8, seed: int = 0) -> KVzapScorer:
    """A random scorer shaped for `model_config` (tests; nothing downloaded): hidden_dim None = linear."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return KVzapScorer(model_config.hidden_size, model_config.num_key_value_heads,
                           model_config.num_hidden_layers, hidden_dim).eval()
