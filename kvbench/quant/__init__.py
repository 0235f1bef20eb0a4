"""Quantized KV pairs (KIVI's rule) for an evicting cache, apart from the cache itself.

The rooms, one idea each:
    kivi.py      the rule: per-channel keys, per-token values, asymmetric min/max, 8 or 4 bits (`Rule`)
    nibbles.py   4-bit codes packed two per byte
    qsplit.py    which held pairs are quantized and which are in the full-precision window; bytes allocated
    qstore.py    `QuantKV`: a group of layers' quantized pairs (append, read, keep), as the cache's `Group`
    qappend.py   appending through the window, flushing whole blocks of G once
    qkeep.py     eviction: values gathered exactly, changed key blocks re-quantized (the error measured)
    qtake.py     slots taken by index (gather by rows of D, fast on a CPU)
    qconfig.py   gen.kv_cache_dtype and its knobs checked, the undefined combinations refused (one line each)
"""
