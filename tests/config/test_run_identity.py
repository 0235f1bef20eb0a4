"""kvbench.config.run_identity: the hash is SHA-1 of the identity's sorted JSON, and the legacy rules leave keys
added later out at their neutral values (so records written before them keep their hash).

The expected hashes are computed here with hashlib on literal identities, not by the module."""

from __future__ import annotations

import hashlib
import json

import pytest

from kvbench.config.run_identity import NON_IDENTITY, record_hash


def _sha(identity: dict) -> str:
    return hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


BASE = {"mode": "run", "seed": 0, "batch_size": 2, "policy": {"_target_": "x.P", "kv_size": 64}}


def _record(**config) -> dict:
    return {"config": {**BASE, **config}, "device": "cuda:1"}


def test_the_hash_of_a_record_is_that_of_its_identity_on_the_resolved_kind():
    want = _sha({**BASE, "device": "cuda"})
    assert record_hash(_record()) == want
    assert record_hash(_record(device="auto")) == want  # the config's own device: replaced by the kind run on
    assert record_hash({**_record(), "device": "cpu"}) == _sha({**BASE, "device": "cpu"})


@pytest.mark.parametrize("key", NON_IDENTITY)
def test_non_identity_keys_change_no_hash(key):
    assert record_hash(_record(**{key: "anything"})) == record_hash(_record())


@pytest.mark.parametrize("extra,same", [
    ({"memory": {"limit_gb": 4, "reserve_gb": 0}}, {"memory": {"limit_gb": 4}}),
    ({"memory": {"limit_gb": 4, "reserve_gb": None}}, {"memory": {"limit_gb": 4}}),
    ({"serve": {"num_blocks": 8}}, {}),  # serve.* outside the serve modes
    ({"memory": {"budget_gb": 4}}, {"memory": {"limit_gb": 4}}),  # a record made before the rename, the same run
])
def test_keys_added_later_at_their_neutral_values_are_left_out(extra, same):
    assert record_hash(_record(**extra)) == record_hash(_record(**same))


def test_policy_keys_added_later():
    pol = {**BASE["policy"], "rerotate": False, "kv_ratio": None, "compression_ratio": None,
           "head_budget": "uniform", "head_floor": 0.2}
    assert record_hash(_record(policy=pol)) == record_hash(_record())
    assert record_hash(_record(policy={**pol, "head_budget": "adaptive"})) != record_hash(_record())
    assert record_hash(_record(policy={**pol, "rerotate": True})) != record_hash(_record())
    assert record_hash(_record(policy={**pol, "kv_ratio": 0.5})) != record_hash(_record())


def test_serve_keys_in_the_serve_modes():
    serve = {"num_blocks": 8, "eviction": "policy", "slo_ttft_s": 1.0, "slo_tpot_s": 0.1, "limit_cap": 99}
    got = record_hash(_record(mode="serve", serve=serve))
    assert got == _sha({**BASE, "mode": "serve", "serve": {"num_blocks": 8}, "device": "cuda"})
    limits = record_hash(_record(mode="serve_limits", serve=serve))  # serve_limits reads limit_cap
    assert limits == _sha({**BASE, "mode": "serve_limits", "serve": {"num_blocks": 8, "limit_cap": 99},
                           "device": "cuda"})
    assert record_hash(_record(mode="serve", serve={**serve, "eviction": "openvino"})) != got


def test_a_record_without_config_or_device_has_no_hash():
    assert record_hash({"device": "cpu"}) is None and record_hash({"config": BASE}) is None
    assert record_hash({"config": BASE, "device": ""}) is None
