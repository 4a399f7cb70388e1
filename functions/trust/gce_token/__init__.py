"""GCE instance identity tokens: check that a token was signed by Google for this audience and say
which VM it names.

A token is an RS256 JWT that the metadata server issues to the VM that asks
(compute/docs/instances/verifying-instance-identity). Google's public keys are x509 certificates
by key id at https://www.googleapis.com/oauth2/v1/certs (`GoogleCerts` fetches and caches them;
`StaticCerts` holds a fixed set, such as the simulator's). The signature, the audience and the
times are checked by google-auth (`google.auth.jwt.decode`); this module adds the size bound, the
issuer, the algorithm, the `google.compute_engine` claims and the project.

Time. A message may be verified long after it was published (a backlog on the bus), and a token
lasts one hour. What matters is that the token was valid when the bus accepted the message
(`valid_at`), not that it still is. google-auth checks `iat` and `exp` against the system clock
with a skew, so its skew is widened by the backlog (`now - valid_at`) plus twice `CLOCK_SKEW`; then
`iat` and `exp` are checked against `valid_at` with `CLOCK_SKEW` (30 s). With `now` on the system
clock, google-auth's window is the same one a skew wider, so the check against `valid_at` decides;
when google-auth refuses first, the (then authentic) claims are checked against `valid_at` to say
which bound failed.

Every refusal raises `TokenError` with what failed and what to check. A certificate set that cannot
be fetched raises `CertsUnavailableError` instead, a `RetryableError`: the message should be tried
again later, not refused.

The modules: errors, certs (the certificate sources), encoding (size, spelling, header), claims
(times, the VM), verify (the entry points). The names the verifiers, the apps and the tests use are
exported here.
"""

from __future__ import annotations

from functions.trust.gce_token.certs import (
    FAILED_FETCH_INTERVAL,
    GOOGLE_CERTS_URL,
    MAX_CACHE_SECONDS,
    MIN_CACHE_SECONDS,
    UNKNOWN_KID_INTERVAL,
    CertSource,
    GoogleCerts,
    StaticCerts,
    cache_lifetime,
)
from functions.trust.gce_token.claims import CLOCK_SKEW, ISSUERS, GceIdentity
from functions.trust.gce_token.encoding import ALGORITHM, MAX_TOKEN_BYTES
from functions.trust.gce_token.errors import CertsUnavailableError, TokenError, TokenExpiredError
from functions.trust.gce_token.verify import verify_identity_token, verify_with_source

__all__ = [
    "ALGORITHM",
    "CLOCK_SKEW",
    "FAILED_FETCH_INTERVAL",
    "GOOGLE_CERTS_URL",
    "ISSUERS",
    "MAX_CACHE_SECONDS",
    "MAX_TOKEN_BYTES",
    "MIN_CACHE_SECONDS",
    "UNKNOWN_KID_INTERVAL",
    "CertSource",
    "CertsUnavailableError",
    "GceIdentity",
    "GoogleCerts",
    "StaticCerts",
    "TokenError",
    "TokenExpiredError",
    "cache_lifetime",
    "verify_identity_token",
    "verify_with_source",
]
