"""Which commands entity carries a VM's commands when a deployment spreads them over several.

A commands topic of Service Bus takes at most 2,000 subscriptions, a queue or topic at most 5,000
concurrent receives, a Pub/Sub topic at most 10,000 subscriptions (docs/scale.md): a deployment
past those spreads its VMs over `shards` commands entities. The shard of a VM is a function of its
name alone, so the functions, `mbridge approve` and the infrastructure that creates each VM's
subscription agree on it without a table: the first 8 hex digits of SHA-256 of the lower-cased
name, read as an integer, modulo the count. Terraform computes the same with
`parseint(substr(sha256(lower(name)), 0, 8), 16) % shards`.

Shard 0 keeps the entity's base name, so a deployment of one shard has the names it always had;
shard k > 0 is `<base>-<k>`. Changing the count moves VMs between entities: do it outside a
maintenance wave (a command waiting in the old entity is not read again).
"""

from __future__ import annotations

import hashlib

# Service Bus entity names take 260 characters and subscription names 50; a count of this size
# keeps every suffix short and is past any fleet the model in docs/scale.md calls for.
MAX_SHARDS = 1024


def validate_shards(shards: int) -> int:
    """`shards` if it is a usable count; ValueError saying what to set otherwise."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"the commands shard count must be a whole number from 1 to {MAX_SHARDS}, got {shards!r}")
    return shards


def shard_of(vm: str, shards: int) -> int:
    """The shard (0 … shards-1) of the VM named `vm`."""
    validate_shards(shards)
    if not vm:
        raise ValueError("a VM's shard needs its name")
    digest = hashlib.sha256(vm.lower().encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % shards


def sharded_name(base: str, shard: int, shards: int) -> str:
    """The name of commands entity `shard` of `shards` that share `base`."""
    validate_shards(shards)
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not one of 0 … {shards - 1}")
    return base if shard == 0 else f"{base}-{shard}"


def entity_for(base: str, vm: str, shards: int) -> str:
    """The commands entity (queue or topic) that carries the commands of `vm`."""
    return sharded_name(base, shard_of(vm, shards), shards)


def parse_shards(text: str) -> int:
    """The shard count written in `text` (a setting, a flag); ValueError saying what it takes."""
    stripped = text.strip()
    if not stripped.isdigit():
        raise ValueError(f"the commands shard count must be a whole number from 1 to {MAX_SHARDS}, got {text!r}")
    return validate_shards(int(stripped))
