"""Published artifacts the leading methods need, loaded from the Hub (or a local copy) and checked against the model:
DuoAttention's head patterns, KVzap's learned scorer, KVzip's repeat-prompt passes."""
