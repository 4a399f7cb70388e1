"""`verify_identity_token` and `verify_with_source`: the whole check of one token, and why it was
refused when google-auth refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from datetime import datetime

from functions.trust.gce_token.certs import CertSource
from functions.trust.gce_token.claims import CLOCK_SKEW, ISSUERS, GceIdentity, aware, compute_engine, iso, times
from functions.trust.gce_token.encoding import check_size, decode, key_id
from functions.trust.gce_token.errors import TokenError


def verify_identity_token(
    token: str,
    *,
    certs: Mapping[str, str],
    audience: str,
    valid_at: datetime,
    now: datetime,
    allowed_projects: Collection[str] | None = None,
) -> GceIdentity:
    """The VM named by `token`, which must have been valid at `valid_at` for `audience`.

    `certs` is key id → PEM certificate (the shape of Google's v1 certs). `valid_at` is when the
    bus accepted the message; `now` is the current time on the system clock (what google-auth
    reads), at or after `valid_at`. With `allowed_projects`, the VM's project must be one of them.
    """
    check_size(token)
    if not audience:
        raise TokenError("no audience to check the token against: configure the deployment's audience")
    if not certs:
        raise TokenError("no certificates to verify the token against: check the trusted certificate set")
    if isinstance(allowed_projects, str):
        raise TokenError("allowed_projects must be a collection of project ids, not one string")
    valid_at, now = aware(valid_at, "valid_at"), aware(now, "now")
    backlog = (now - valid_at).total_seconds()
    if backlog < -CLOCK_SKEW.total_seconds():
        raise TokenError(f"the message was accepted at {iso(valid_at)}, after now ({iso(now)}): check the clocks")
    kid = key_id(token)
    if kid not in certs:
        raise TokenError(
            f"the token is signed with key {kid!r}, which is not among the {len(certs)} trusted certificates "
            f"({', '.join(sorted(certs))}): Google rotates its keys, so refresh the certificates "
            "(GoogleCerts does on an unknown key id); with the simulator, trust the certificates of the run that "
            "issued the token"
        )
    widened = math.ceil(max(backlog, 0.0) + 2 * CLOCK_SKEW.total_seconds())
    try:
        payload = decode(token, certs=dict(certs), audience=audience, clock_skew_in_seconds=widened)
    except Exception as exc:  # google-auth parses untrusted input: whatever it raises is a refusal
        raise _refusal(exc, token, kid, audience, valid_at) from exc
    if not isinstance(payload, Mapping):
        raise TokenError("the token's payload is not a JSON object")
    issuer = payload.get("iss")
    if not isinstance(issuer, str) or issuer not in ISSUERS:
        raise TokenError(
            f"the token was issued by {issuer!r}, not by Google ({' or '.join(sorted(ISSUERS))}): "
            "it is not a GCE identity token"
        )
    issued_at, expires_at = times(payload, valid_at)
    vm = compute_engine(payload)
    if allowed_projects is not None and vm["project_id"] not in allowed_projects:
        allowed = ", ".join(sorted(allowed_projects)) or "none"
        raise TokenError(
            f"the token names a VM of project {vm['project_id']!r}, which is not allowed (allowed: {allowed}): "
            "add the project to the allowed ones, or check which project the VM runs in"
        )
    return GceIdentity(
        instance_name=vm["instance_name"],
        instance_id=vm["instance_id"],
        project_id=vm["project_id"],
        zone=vm["zone"],
        audience=audience,
        issued_at=issued_at,
        expires_at=expires_at,
    )


def verify_with_source(
    token: str,
    *,
    source: CertSource,
    audience: str,
    valid_at: datetime,
    now: datetime,
    allowed_projects: Collection[str] | None = None,
) -> GceIdentity:
    """`verify_identity_token` with the certificates of `source`, refreshed for an unknown key id."""
    check_size(token)
    certs = source.get_for(key_id(token))
    return verify_identity_token(
        token, certs=certs, audience=audience, valid_at=valid_at, now=now, allowed_projects=allowed_projects
    )


def _refusal(exc: Exception, token: str, kid: str, audience: str, valid_at: datetime) -> TokenError:
    text = str(exc)
    if "signature" in text:
        return TokenError(
            f"the token's signature does not verify with certificate {kid!r}: the token was altered, or signed by "
            f"a key other than the certificate's ({text})"
        )
    if "expired" in text or "too early" in text:
        # google-auth checks the times only once the signature verified: the claims are authentic,
        # so the check against valid_at can say which bound failed.
        try:
            times(decode(token, verify=False), valid_at)
        except TokenError as precise:
            return precise
        except Exception:  # noqa: S110 - the message below stands
            pass
        return TokenError(
            f"the token's times are off by more than the backlog from this system's clock ({text}): "
            "check the clock, and the `now` given"
        )
    if "audience" in text:
        return TokenError(
            f"the token is not for audience {audience!r} ({text}): the sender must request its token with this "
            "deployment's audience"
        )
    return TokenError(f"the token cannot be verified: {text or type(exc).__name__}")
