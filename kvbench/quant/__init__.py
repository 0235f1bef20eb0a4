"""Quantized KV pairs (KIVI's rule) for an evicting cache, apart from the cache itself.

The rooms, one idea each:
    kivi.py      the rule: per-channel keys, per-token values, asymmetric min/max, 8 or 4 bits (`Rule`)
    nibbles.py   4-bit codes packed two per byte
"""
