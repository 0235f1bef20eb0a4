"""What both sides of `make crosscheck` share about the presses scored from values, hidden states, a second
pass over the context or calibrated head patterns (no heavy import: kvbench's and kvpress's venvs read it).

Each runs at compression 0.25, 0.5 and 0.75 (RATIOS) on the 16 prompts of ids.json, batch 1, 64 new tokens,
the prompt compressed once after prefill, like the other presses. What a side needs beyond the prompts, so
that both run offline on the same data:

- DuoAttention's on-the-fly head patterns: kvpress calibrates on 50 BookSum chapters from the Hub; here on the
  first DUO_TEXTS CNN/DM validation articles (WORK/calibration.json, written once from DATA_DIR). The "ratio"
  is DuoAttention's head_compression_ratio (the share of streaming heads).
- KVzap: the published scorers (nvidia/KVzap-mlp-<model>) exist for 8B models only; here a random 2-layer MLP
  scorer in the Hub's layout (WORK/kvzap-mlp/: config.json + model.safetensors, KVZAP_HIDDEN hidden units,
  seed KVZAP_SEED, torch's default initialisation, then its last layer's weights times KVZAP_GAIN and its
  bias KVZAP_BIAS, so that its outputs spread like log-scores). `kvzap_mlp` is the
  leaderboard's DMSPress over it, by threshold: its "ratio" slot carries the threshold (DMS_THRESHOLDS).
- Compactor's leverage scores draw a Gaussian sketch from torch's global generator: seeded with SKETCH_SEED
  before each prompt's prefill, the sketch of layer l is the l-th draw of shape (1, H_kv, D, sketch_dim).
"""

RATIOS = (0.25, 0.5, 0.75)
DUO_TEXTS = 50
KVZAP_HIDDEN, KVZAP_SEED, KVZAP_GAIN, KVZAP_BIAS = 64, 0, 20.0, -5.0
DMS_THRESHOLDS = (-5.5, -5.0, -4.5)
SKETCH_SEED = 0

# press name -> (kvpress class, its arguments; an inner press as (class, arguments) under "press")
PRESSES = {
    "expected_attention": ("ExpectedAttentionPress", {}),
    # the leaderboard's "expected_attention": AdaKV's head budgets over ExpectedAttention with epsilon 1e-2
    "adakv_expected_attention": ("AdaKVPress", dict(press=("ExpectedAttentionPress", dict(epsilon=1e-2)),
                                                    alpha_safeguard=0.2)),
    "kvzip": ("KVzipPress", {}),
    "kvzip_plus": ("KVzipPress", dict(kvzip_plus_normalization=True)),
    "kvgrad": ("KVgradPress", {}),
    "duo_attention_on_the_fly": ("DuoAttentionPress", dict(on_the_fly_scoring=True)),
    "kvzap_mlp_head": ("KVzapPress", dict(model_type="mlp")),
    "kvzap_mlp": ("DMSPress", dict(press=("KVzapPress", dict(model_type="mlp")), sliding_window_size=128)),
    "lagkv": ("LagKVPress", {}),
    "compactor": ("CompactorPress", {}),
    # AdaKV's head budgets over Compactor's scores (kvpress's safeguard 0.2, as the other AdaKV rows)
    "adakv_compactor": ("AdaKVPress", dict(press=("CompactorPress", {}), alpha_safeguard=0.2)),
    "critical_snapkv": ("CriticalKVPress", dict(press=("SnapKVPress", dict(window_size=64, kernel_size=5)))),
    "critical_expected_attention": ("CriticalKVPress", dict(press=("ExpectedAttentionPress", dict(use_vnorm=False)))),
    "chunkkv": ("ChunkKVPress", dict(press=("SnapKVPress", dict(window_size=64, kernel_size=5)), chunk_length=20)),
}


def settings(name: str) -> tuple[float, ...]:
    """The values a press runs at: compression ratios, or DMS thresholds."""
    return DMS_THRESHOLDS if PRESSES[name][0] == "DMSPress" else RATIOS
