"""The shard of a VM: stable, spread, shared with Terraform's expression, refused when out of range."""

from __future__ import annotations

import collections

import pytest

from tests.infra.console import evaluate, needs_terraform
from wire.shards import MAX_SHARDS, entity_for, shard_of, sharded_name, validate_shards


def test_one_shard_keeps_the_base_name_for_every_vm() -> None:
    assert {entity_for("maintenance-commands", f"web-{i}", 1) for i in range(50)} == {"maintenance-commands"}


def test_shard_names_are_the_base_then_numbered() -> None:
    assert [sharded_name("maintenance-commands", k, 3) for k in range(3)] == [
        "maintenance-commands",
        "maintenance-commands-1",
        "maintenance-commands-2",
    ]


def test_the_shard_is_a_function_of_the_name_whatever_its_case() -> None:
    assert shard_of("Web-17", 8) == shard_of("web-17", 8)
    # Pinned values: the functions, mbridge approve and infra/ must agree on it across versions.
    assert [shard_of(f"vm-{i}", 8) for i in range(8)] == [7, 3, 7, 4, 4, 3, 1, 0]


def test_ten_thousand_names_spread_over_eight_shards_within_ten_percent_of_even() -> None:
    counts = collections.Counter(shard_of(f"web-{i:05d}", 8) for i in range(10_000))
    assert set(counts) == set(range(8))
    assert max(counts.values()) <= 1.1 * 10_000 / 8


@pytest.mark.parametrize("bad", [0, -1, MAX_SHARDS + 1, True, 2.0, "4"])
def test_a_shard_count_out_of_range_is_refused_with_the_range(bad: object) -> None:
    with pytest.raises(ValueError, match="from 1 to"):
        validate_shards(bad)  # type: ignore[arg-type]


def test_a_shard_outside_the_count_and_an_empty_name_are_refused() -> None:
    with pytest.raises(ValueError, match="not one of"):
        sharded_name("maintenance-commands", 3, 3)
    with pytest.raises(ValueError, match="needs its name"):
        shard_of("", 3)


@needs_terraform
def test_terraform_computes_the_same_shard() -> None:
    names = ["web-0", "Web-1", "db-primary", "gce-0", "a" * 60]
    expression = "[" + ", ".join(f'parseint(substr(sha256(lower("{n}")), 0, 8), 16) % 7' for n in names) + "]"
    assert evaluate(None, expression, timeout=60) == [shard_of(n, 7) for n in names]
