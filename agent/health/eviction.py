"""Whom the health server closes when its table of connections is full and another one comes.

A probe connects and sends its request a few milliseconds later; until then it looks exactly like
an idle connection of a flood. Closing the oldest connection, as the server once did, let anyone
who opens connections faster than that close the probe before its request arrived. What does tell
them apart is where they come from: a load balancer's or kubelet's probe comes from its own
address, holding one connection or a few, while a flood from one host holds many. So the server
closes a connection of the address that holds the most (the newcomer counted), whatever the rate
of the flood:

1. of the addresses holding the most connections,
2. one that has had its whole answer and only waits for the client to close (closing it costs
   the client nothing: the answer is sent), else
3. the oldest.

An IPv6 host is usually given a whole /64, so IPv6 addresses count by their /64 network; an
IPv4-mapped address counts as the IPv4 address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

IPV6_HOST_PREFIX = 64


class Evictable(Protocol):
    @property
    def peer(self) -> str: ...

    @property
    def answered(self) -> bool: ...


C = TypeVar("C", bound=Evictable)


def peer_of(address: object) -> str:
    """The key a connection counts under: its IPv4 address, or its IPv6 /64 network."""
    host = address[0] if isinstance(address, tuple) and address else address
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])  # without an IPv6 zone ("fe80::1%eth0")
    except ValueError:
        return str(host)  # not an IP address (a Unix socket's path): one key, like one host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_HOST_PREFIX), strict=False))
    return str(ip)


def victim(held: Iterable[C], held_per_peer: Mapping[str, int], newcomer_peer: str) -> C:
    """The connection to close so that one from `newcomer_peer` can be held.

    `held` runs oldest first and must not be empty; `held_per_peer` counts it by `peer`.
    """

    def crowd(peer: str) -> int:
        return held_per_peer.get(peer, 0) + (peer == newcomer_peer)

    # min() keeps the first of equals: the oldest
    return min(held, key=lambda connection: (-crowd(connection.peer), not connection.answered))
