"""Full cache (FKV): no eviction; the accuracy reference."""

from dataclasses import dataclass
from typing import ClassVar

from kvbench.errors import ConfigError
from kvbench.policies.policy import Policy


@dataclass
class Full(Policy):
    name: ClassVar[str] = "full"
    label: ClassVar[str] = "FKV"
    summary: ClassVar[str] = "every pair: the accuracy reference (FKV)"
    inert_keys: ClassVar[tuple[str, ...]] = ("kv_size", "kv_ratio", "compression_ratio", "evict_every", "schedule",
                                             "protect_first", "protect_recent", "rerotate", "head_budget",
                                             "head_floor")  # it never evicts

    def validate(self) -> None:
        if self.kv_size is not None:
            raise ConfigError("policy.kv_size", "policy=full keeps every pair; leave kv_size null", self.kv_size)
        if self.kv_ratio is not None:
            raise ConfigError("policy.kv_ratio", "policy=full keeps every pair; leave kv_ratio null", self.kv_ratio)
        if self.compression_ratio is not None:
            raise ConfigError("policy.compression_ratio", "policy=full keeps every pair; leave it null",
                              self.compression_ratio)
        if self.head_budget != "uniform":
            raise ConfigError("policy.head_budget", "policy=full keeps every pair; leave head_budget uniform",
                              self.head_budget)
        if self.rerotate is True:
            raise ConfigError("policy.rerotate", "policy=full never evicts, so there is nothing to re-rotate", True)
        super().validate()
