"""Errors kvbench reports to users as one line (the CLI turns them into exit code 2)."""


class ConfigError(ValueError):
    """A bad override or an inconsistent configuration, found before any model is loaded.

    `key` is the override path (e.g. "policy.kv_size"), `value` what the user gave.
    """

    def __init__(self, key: str, message: str, value=None):
        self.key, self.value = key, value
        shown = key if value is None else f"{key}={value}"
        super().__init__(f"{shown}: {message}")


class OutOfMemory(RuntimeError):
    """A run needed more memory than the budget allows (accounted on CPU, real on CUDA).

    `kind`: "accounted" (kvbench's CPU budget refused it: deterministic, final) or "measured" (an
    allocator really ran out: possibly transient, retried once by skip_existing); None: not known.
    """

    def __init__(self, message: str = "", kind: str | None = None):
        super().__init__(message)
        self.kind = kind
