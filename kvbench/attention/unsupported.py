"""The attention library's own errors. It knows no config key: the CLI and the config checks turn an
`UnsupportedBackend` into a one-line refusal naming `gen.attention` (kvbench.config)."""

from __future__ import annotations


class AttentionError(RuntimeError):
    """Attention cannot run as asked (a layer's kind of attention against the cache's, a backend's first check)."""


class UnsupportedBackend(AttentionError):
    """The backend asked for cannot run this model or policy; `backend` names it, `reason` says why."""

    def __init__(self, backend: str, reason: str):
        self.backend, self.reason = backend, reason
        super().__init__(f"attention backend {backend}: {reason}")
