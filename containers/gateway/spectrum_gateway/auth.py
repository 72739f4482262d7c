"""Who is calling: API keys and JWTs → a principal (tenant, key id, the key's models).

API keys look like ``sk-spg-<id>-<secret part>``. Only ``HMAC-SHA256(server secret, key)`` is
stored, under the key's id; a presented key is looked up by its id and compared to the
stored digest in constant time, so neither a leaked store nor response timing gives a key
away. The key itself is never logged, never put in a metric, never echoed in an error.

JWTs are accepted when the config has a ``jwt:`` section: RS256 or ES256 only, verified
against the JWKS (file or URL), with ``exp`` required and ``nbf``, ``iss``, ``aud`` checked.
``alg: none`` and HMAC algorithms are refused before any verification, so a token signed with
HS256 using the public key as the "secret" gets nowhere.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from .config import GatewayConfig
from .errors import GatewayError

KEY_PREFIX = "sk-spg-"
KEY_RE = re.compile(r"^sk-spg-([0-9a-f]{12})-[A-Za-z0-9_-]{20,}$")
SECRET_ENV = "SPECTRUM_GATEWAY_SECRET"
JWT_ALGORITHMS = ("RS256", "ES256")


@dataclass(frozen=True)
class Principal:
    tenant: str
    key_id: str                       # the API key's id, or "jwt:<sub>"
    models: tuple[str, ...] | None    # the key's own model restriction (None: the tenant's)


def load_secret(config: GatewayConfig, create: bool = True) -> bytes:
    """The HMAC secret: ``$SPECTRUM_GATEWAY_SECRET``, else the config's ``secret_file``
    (created with 32 random bytes, mode 0600, the first time; workers and ``admin`` share it)."""
    if os.environ.get(SECRET_ENV):
        return os.environ[SECRET_ENV].encode()
    path: Path = config.secret_file
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:   # O_EXCL: two workers starting together create one secret, not two
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        except FileExistsError:
            pass
    try:
        secret = path.read_text().strip()
    except OSError as e:
        raise GatewayError(500, f"cannot read the gateway's secret file {str(path)!r}: "
                                f"{e.strerror}; set {SECRET_ENV} or secret_file", "no_secret")
    if len(secret) < 16:
        raise GatewayError(500, f"the secret in {str(path)!r} is shorter than 16 characters",
                           "weak_secret")
    return secret.encode()


def new_key() -> tuple[str, str]:
    """A fresh (id, key)."""
    key_id = secrets.token_hex(6)
    return key_id, f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"


def key_digest(secret: bytes, key: str) -> str:
    return keyed_hmac(secret)(key)


def keyed_hmac(secret: bytes):
    """``key → HMAC-SHA256(secret, key)`` in hex. The secret is keyed in once and copied per
    key: OpenSSL's one-shot HMAC looks its algorithms up again on every call, which under
    load cost the gateway more than the hashing."""
    keyed = hmac.new(secret, digestmod=hashlib.sha256)

    def digest(key: str) -> str:
        h = keyed.copy()
        h.update(key.encode())
        return h.hexdigest()
    return digest


def presented_credential(headers) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        raise GatewayError(401, "the Authorization header must be 'Bearer <API key or JWT>'",
                           "invalid_authorization_header")
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


class Authenticator:
    def __init__(self, config: GatewayConfig, store, secret: bytes) -> None:
        self.config, self.store = config, store
        self._digest = keyed_hmac(secret)
        self._jwks = None
        self._jwks_mtime = None
        self._jwks_client = None

    async def authenticate(self, headers) -> Principal:
        token = presented_credential(headers)
        if token is None:
            raise GatewayError(401, "no API key: send 'Authorization: Bearer <key>' or "
                                    "'x-api-key: <key>'", "missing_api_key")
        if looks_like_jwt(token):
            return await self._jwt(token)
        return await self._api_key(token)

    async def _api_key(self, key: str) -> Principal:
        match = KEY_RE.match(key)
        record = await self.store.get_key(match.group(1)) if match else None
        # Compare even when there is no record, so a wrong id costs the same time as a wrong key.
        stored = record["hash"] if record else "0" * 64
        if not hmac.compare_digest(stored, self._digest(key)) or record is None:
            raise GatewayError(401, "invalid API key: it is not one this gateway issued "
                                    "(create one with 'admin keys create')", "invalid_api_key")
        if record.get("revoked_at"):
            raise GatewayError(401, f"API key {record['id']} was revoked at {record['revoked_at']}",
                               "revoked_api_key")
        models = record.get("models")
        return Principal(record["tenant"], record["id"], tuple(models) if models else None)

    # --- JWT
    def _jwk_for(self, token: str, kid: str | None):
        import jwt
        settings = self.config.jwt
        if settings.jwks_url:
            if self._jwks_client is None:
                self._jwks_client = jwt.PyJWKClient(settings.jwks_url, cache_keys=True, lifespan=300)
            return self._jwks_client.get_signing_key_from_jwt(token)
        path = Path(settings.jwks_file)
        mtime = path.stat().st_mtime_ns
        if mtime != self._jwks_mtime:       # a rotated JWKS file is picked up without a restart
            self._jwks, self._jwks_mtime = jwt.PyJWKSet.from_json(path.read_text()), mtime
        keys = self._jwks.keys
        if kid is None and len(keys) == 1:
            return keys[0]
        for k in keys:
            if k.key_id == kid:
                return k
        raise GatewayError(401, f"JWT refused: no key with kid {kid!r} in the JWKS",
                           "invalid_jwt")

    async def _jwt(self, token: str) -> Principal:
        import jwt
        settings = self.config.jwt
        if settings is None:
            raise GatewayError(401, "JWTs are not accepted here: the gateway config has no jwt: "
                                    "section; use an API key", "invalid_api_key")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise GatewayError(401, f"JWT refused: malformed header ({e})", "invalid_jwt")
        alg = header.get("alg")
        if alg not in JWT_ALGORITHMS:
            raise GatewayError(401, f"JWT refused: alg {alg!r} is not accepted; tokens must be "
                                    f"signed with {' or '.join(JWT_ALGORITHMS)} by a key in the "
                                    "JWKS", "invalid_jwt")
        try:
            if settings.jwks_url:
                jwk = await asyncio.to_thread(self._jwk_for, token, header.get("kid"))
            else:
                jwk = self._jwk_for(token, header.get("kid"))
            required = ["exp"] + (["iss"] if settings.issuer else []) + (["aud"] if settings.audience else [])
            claims = jwt.decode(token, key=jwk.key, algorithms=[alg], issuer=settings.issuer,
                                audience=settings.audience, options={"require": required})
        except GatewayError:
            raise
        except jwt.PyJWTError as e:
            raise GatewayError(401, f"JWT refused: {e}", "invalid_jwt")
        except (ValueError, TypeError, OSError) as e:   # wrong key type for the alg, unreadable JWKS
            raise GatewayError(401, f"JWT refused: {e}", "invalid_jwt")
        tenant = claims.get(settings.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise GatewayError(403, f"the JWT has no {settings.tenant_claim!r} claim naming its "
                                    "tenant", "no_tenant")
        return Principal(tenant, f"jwt:{claims.get('sub', '?')}", None)
