"""kvbench: KV-cache eviction policies during prefill and decode, benchmarked."""
__version__ = "0.1.0"
