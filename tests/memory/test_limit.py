"""kvbench.memory.limit: admission under a memory limit. A CPU batch one byte over the usable limit (the limit
less the reserve) is refused as an accounted out-of-memory carrying its account; one at the limit, and any
CUDA device (capped for real), is admitted; the old names are the new objects."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from kvbench.errors import OutOfMemory
from kvbench.memory import limit
from kvbench.memory.accounting import Account, Footprint, GiB


def acc(cpu: int, cuda: int = 0) -> Account:
    return Account({"cpu": Footprint(weights=cpu, kv_cache=0, transient=0),
                    "cuda:0": Footprint(weights=cuda, kv_cache=0, transient=0)})


def test_cpu_admission_at_the_usable_bytes():
    m = limit.MemoryLimit(gb=1.0, reserve_gb=0.25)
    assert (m.bytes, m.usable) == (GiB, GiB * 3 // 4)
    m.admit(acc(m.usable, cuda=10 * GiB))  # at the limit on CPU; CUDA is never refused here
    with pytest.raises(limit.MemoryLimitExceeded) as e:
        m.admit(acc(m.usable + 1))
    assert isinstance(e.value, OutOfMemory) and e.value.kind == "accounted" and e.value.account.total == m.usable + 1
    assert "memory.limit_gb=1 less memory.reserve_gb=0.25 on cpu" in str(e.value)  # the user's key, unchanged


def test_memory_limit_of_reads_the_config_keys():
    cfg = OmegaConf.create({"memory": {"limit_gb": 2, "reserve_gb": None}})
    assert limit.memory_limit_of(cfg) == limit.MemoryLimit(2.0, 0.0)
    assert limit.memory_limit_of(OmegaConf.create({"memory": {"limit_gb": None}})) is None


def test_old_names_are_gone():
    """"Budget" means KV pairs: the memory limit's old names are deleted, not aliased."""
    from kvbench import memory

    assert not any(hasattr(memory, n) for n in ("Budget", "BudgetExceeded", "budget_of"))
