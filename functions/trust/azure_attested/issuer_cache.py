"""The issuing CAs fetched from caIssuers URLs, kept per URL in a small process-wide LRU cache.

A function instance verifies many documents signed under the same few intermediates; fetching each
once saves a round trip per message.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from cryptography import x509

ISSUER_CACHE_SIZE = 16


_issuer_cache: OrderedDict[str, tuple[x509.Certificate, ...]] = OrderedDict()
_cache_lock = threading.Lock()


def clear_issuer_cache() -> None:
    """Forget the issuing CAs fetched so far (they are fetched again when needed)."""
    with _cache_lock:
        _issuer_cache.clear()


def cached(url: str) -> list[x509.Certificate] | None:
    with _cache_lock:
        certificates = _issuer_cache.get(url)
        if certificates is None:
            return None
        _issuer_cache.move_to_end(url)
        return list(certificates)


def remember(url: str, certificates: list[x509.Certificate]) -> None:
    with _cache_lock:
        _issuer_cache[url] = tuple(certificates)
        _issuer_cache.move_to_end(url)
        while len(_issuer_cache) > ISSUER_CACHE_SIZE:
            _issuer_cache.popitem(last=False)
