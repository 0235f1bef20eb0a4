"""Whether a server answers at all, decided within a time limit (no retries, no library's own backoff).

Used before a run where a library would otherwise retry for minutes with no network: W&B's server
(kvbench.wandb_logger) and the Hugging Face Hub (kvbench.models.hub). Any HTTP answer counts (the
library judges it); no name, no route, a refused connection or silence until the timeout do not.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request


def answers(url: str, timeout: float, cache: dict[str, bool] | None = None) -> bool:
    """Whether `url` gives any HTTP answer within `timeout` s (name lookup included); cached in `cache`."""
    if cache is not None and url in cache:
        return cache[url]
    answered: list[bool] = []

    def ask() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout):
                answered.append(True)
        except urllib.error.HTTPError:  # an answer, if not a welcome one
            answered.append(True)
        except (OSError, ValueError):  # URLError, timeouts, refused connections, a malformed URL
            answered.append(False)

    t = threading.Thread(target=ask, daemon=True)  # bounds a slow name lookup too
    t.start()
    t.join(timeout)
    ok = bool(answered and answered[0])
    if cache is not None:
        cache[url] = ok
    return ok
