"""GCE instance identity tokens, as `instance/service-accounts/default/identity` issues them.

On GCE the token is an RS256 JWT signed by Google, whose public keys are published as x509
certificates by key id at https://www.googleapis.com/oauth2/v1/certs. The simulator cannot sign as
Google, so it makes RSA 2048 keys of its own per run, each with a key id and a self-signed
certificate, and publishes them in the same shape (`TokenIssuer.certs()`): a verifier that trusts
these certificates instead of Google's checks a simulated token exactly as it checks a real one.

The claims are the documented ones (compute/docs/instances/verifying-instance-identity, "Token
format"): `iss`, `iat`, `exp` (one hour on), `aud`, `sub` and `azp` (the service account's unique id),
and with format=full `google.compute_engine` {project_id, project_number, zone, instance_id,
instance_name, instance_creation_timestamp}. A simulated VM is not a Confidential VM and boots no
licensed image, so `instance_confidentiality` and `license_id` never appear.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

ISSUER = "https://accounts.google.com"
TOKEN_LIFETIME = timedelta(hours=1)  # "each token expires within one hour"
KEY_SIZE = 2048
KEY_COUNT = 2  # Google publishes the signing key and the next one; tokens are signed with the first
CERT_LIFETIME = timedelta(days=14)  # about what Google's published certificates carry

# google-auth's functions carry no annotations; these names give them the types they document.
_signer_from_pem: Callable[..., crypt.Signer] = crypt.RSASigner.from_string
_encode_jwt: Callable[..., bytes] = jwt.encode


@dataclass(frozen=True)
class SigningKey:
    """One key: its id (the JWT header's `kid`), the private key, and its self-signed certificate."""

    kid: str
    private_key: rsa.RSAPrivateKey
    certificate_pem: str


class TokenIssuer:
    """Signs instance identity tokens with keys made for this run; `certs()` publishes them."""

    def __init__(self, keys: Sequence[SigningKey], created_at: datetime) -> None:
        if not keys:
            raise ValueError("a token issuer needs at least one signing key")
        kids = [key.kid for key in keys]
        if len(set(kids)) != len(kids):
            raise ValueError(f"key ids must be unique, got {kids}")
        self._keys = tuple(keys)
        self._created_at = _utc(created_at)
        first = self._keys[0]
        pem = first.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self._signer = _signer_from_pem(pem, key_id=first.kid)

    @classmethod
    def generate(cls, now: datetime | None = None, key_count: int = KEY_COUNT) -> TokenIssuer:
        """New RSA 2048 keys, each with a key id and a self-signed certificate valid from `now`."""
        moment = _utc(now) if now is not None else datetime.now(timezone.utc)
        return cls([_new_key(moment) for _ in range(key_count)], created_at=moment)

    @property
    def keys(self) -> tuple[SigningKey, ...]:
        """The keys, the signing one first."""
        return self._keys

    @property
    def created_at(self) -> datetime:
        return self._created_at

    def certs(self) -> dict[str, str]:
        """Key id → PEM certificate: exactly the shape of Google's oauth2/v1/certs document."""
        return {key.kid: key.certificate_pem for key in self._keys}

    def issue(
        self,
        audience: str,
        *,
        instance_name: str,
        instance_id: str,
        project_id: str,
        project_number: str,
        zone: str,
        full: bool,
        now: datetime,
        instance_creation_timestamp: int | None = None,
    ) -> str:
        """A signed token for `audience`, issued at `now` (whole seconds) and valid for an hour.

        `zone` is the short zone name (us-central1-a), as in the token; `project_number` the decimal
        number, which the token carries as a JSON number. `instance_creation_timestamp` (epoch
        seconds) defaults to when this issuer was made.
        """
        if not audience:
            raise ValueError("an identity token needs a non-empty audience")
        issued = int(_utc(now).timestamp())
        subject = service_account_id(project_number)
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "iat": issued,
            "exp": issued + int(TOKEN_LIFETIME.total_seconds()),
            "aud": audience,
            "sub": subject,
            "azp": subject,
        }
        if full:
            created = instance_creation_timestamp
            if created is None:
                created = int(self._created_at.timestamp())
            claims["google"] = {
                "compute_engine": {
                    "project_id": project_id,
                    "project_number": int(project_number),
                    "zone": zone,
                    "instance_id": instance_id,
                    "instance_name": instance_name,
                    "instance_creation_timestamp": created,
                }
            }
        return _encode_jwt(self._signer, claims).decode("ascii")


def service_account_id(project_number: str) -> str:
    """A stable 21-digit unique id for the project's default service account (`sub` and `azp`)."""
    digest = hashlib.sha256(f"{project_number}-compute@developer.gserviceaccount.com".encode()).hexdigest()
    return str(10**20 + int(digest, 16) % (9 * 10**20))


def _new_key(now: datetime) -> SigningKey:
    private_key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_SIZE)
    public_der = private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # Google's key ids are 40 hex digits; these are derived from the public key.
    kid = hashlib.sha256(public_der).hexdigest()[:40]
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"maintenance-bridge simulator {kid[:8]}")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + CERT_LIFETIME)
        .sign(private_key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")
    return SigningKey(kid=kid, private_key=private_key, certificate_pem=pem)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("give an aware datetime (UTC), not a naive one")
    return moment.astimezone(timezone.utc)
