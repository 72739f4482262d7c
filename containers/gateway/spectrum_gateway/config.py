"""The gateway's configuration file: loaded, checked and turned into plain dataclasses.

Every mistake is reported with the file's line and the key's path (``tenants.acme.rpm``),
all of them at once, before the server binds its port: a gateway that starts with a
fallback that does not exist fails its users later, under load, instead of its operator now.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from options.core.affinity import DEFAULT_LOAD_BOUND, DEFAULT_LOAD_FLOOR

from .http1 import (DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_ERROR_BODY_BYTES,
                    DEFAULT_MAX_HEADER_BYTES, parse_proxy, tls_context)

# SageMaker's real-time payload limit: a body the slowest rung would refuse is refused here.
DEFAULT_MAX_BODY_BYTES = 6 * 1024 * 1024
# Tokens reserved for a request that names no max_tokens (refunded after, as every reservation).
DEFAULT_MAX_TOKENS = 1024
# How an upstream's replicas share requests (``balance``); see routing.Replicas.
BALANCES = ("affinity", "least_in_flight", "round_robin")
# A session may hold a replica while it has fewer than DEFAULT_LOAD_BOUND × the mean in-flight per
# replica, and in any case while it has fewer than DEFAULT_LOAD_FLOOR (options.core.affinity).
# A replica that refused, timed out or answered 5xx is skipped this long.
DEFAULT_EJECT_S = 5.0
# A session's attained count is forgotten this long after its last request.
DEFAULT_SESSION_TTL_S = 900.0
# The Redis ledger keeps at most this many entries and this many days (trimmed as it grows).
DEFAULT_LEDGER_MAX_ENTRIES = 5_000_000
DEFAULT_LEDGER_RETENTION_DAYS = 62.0
# How long a Redis concurrency slot lives without its worker renewing it (see quota.py).
DEFAULT_CONCURRENCY_LEASE_S = 30.0
# What the upstream client takes (http1.py): a head smaller than this cannot hold a server's
# usual headers, so a lower limit would only refuse good answers.
MIN_MAX_HEADER_BYTES = 1024


class ConfigError(ValueError):
    """A configuration the operator must fix; the message names every bad line and key."""


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's allowance; ``None`` means unlimited."""
    name: str
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None
    budget_usd_month: float | None = None
    models: tuple[str, ...] = ("*",)

    def allows(self, model: str) -> bool:
        return "*" in self.models or model in self.models


@dataclass(frozen=True)
class Upstream:
    """One server that can answer a model: OpenAI-compatible over HTTP, or a managed rung."""
    name: str
    weight: float
    url: str | None = None                 # OpenAI-compatible base URL (…/v1 added when absent)
    urls: tuple[str, ...] = ()             # its replicas (``url`` alone: one); url is urls[0]
    balance: str = "affinity"              # how the replicas share requests (BALANCES)
    load_bound: float = DEFAULT_LOAD_BOUND
    load_floor: int = DEFAULT_LOAD_FLOOR
    eject_s: float = DEFAULT_EJECT_S
    model: str | None = None               # the name the upstream knows the model by
    api_key_env: str | None = None         # environment variable holding the upstream's key
    bedrock: dict | None = None            # {model_id, region?, endpoint_url?}
    sagemaker: dict | None = None          # {endpoint, dialect?, region?, endpoint_url?}
    usd_per_mtok_input: float = 0.0        # prices for the monthly budget and the ledger
    usd_per_mtok_output: float = 0.0
    # How the HTTP client reaches it (http1.UpstreamOptions): an http:// proxy (None: the
    # environment's), the CA file to verify it against, a client certificate and its key.
    proxy: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    # ... and how much it takes from it (the global upstream_max_* unless set here).
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_error_body_bytes: int = DEFAULT_MAX_ERROR_BODY_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @property
    def kind(self) -> str:
        return "openai" if self.url else "bedrock" if self.bedrock else "sagemaker"

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.usd_per_mtok_input + output_tokens * self.usd_per_mtok_output) / 1e6


@dataclass(frozen=True)
class Priority:
    """Program-aware priority: vLLM's ``priority`` set on each request from its session's
    attained count, so a running program's later steps go before new programs' first."""
    later_steps_first: bool = False
    session_ttl_s: float = DEFAULT_SESSION_TTL_S


@dataclass(frozen=True)
class Model:
    name: str
    upstreams: tuple[Upstream, ...]
    tenant_overrides: dict = field(default_factory=dict)   # tenant → upstream name
    fallback: tuple[str, ...] = ()
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    priority: Priority = Priority()

    def upstream(self, name: str) -> Upstream:
        return next(u for u in self.upstreams if u.name == name)


@dataclass(frozen=True)
class JwtSettings:
    jwks_file: str | None = None
    jwks_url: str | None = None
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: str = "tenant"


@dataclass(frozen=True)
class StoreOptions:
    """How to reach a Redis store beyond its URL (``store: {url: ..., ...}`` in the file)."""
    ca_file: str | None = None         # rediss://: the CA its certificate must chain to
    password_env: str | None = None    # a variable holding the password or IAM auth token
    password_file: str | None = None   # a file holding it, re-read when it changes
    serverless: bool = False           # ElastiCache Serverless: TLS, database 0 only


@dataclass(frozen=True)
class GatewayConfig:
    path: Path
    store: str                              # "memory" or "redis://host:port/db"
    state_dir: Path                         # memory store: keys file and ledger; secret file
    secret_file: Path
    tenants: dict                           # name → TenantLimits
    models: dict                            # name → Model
    jwt: JwtSettings | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    connect_timeout_s: float = 2.0
    upstream_timeout_s: float = 60.0        # the longest wait for the upstream's next bytes
    # An unreachable store is a 503 within the connect timeout (a refused connection: at
    # once); a reachable one gets longer per command, as a busy event loop delays replies.
    store_connect_timeout_ms: float = 100.0
    store_command_timeout_ms: float = 1000.0
    ledger_max_entries: int = DEFAULT_LEDGER_MAX_ENTRIES
    ledger_retention_days: float = DEFAULT_LEDGER_RETENTION_DAYS
    concurrency_lease_s: float = DEFAULT_CONCURRENCY_LEASE_S
    store_options: StoreOptions = StoreOptions()    # (store: {url: ..., ca_file: ...})
    # Every HTTP upstream's limits unless it sets its own (max_header_bytes, ...).
    upstream_max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    upstream_max_error_body_bytes: int = DEFAULT_MAX_ERROR_BODY_BYTES
    upstream_max_connections: int = DEFAULT_MAX_CONNECTIONS

    @property
    def uses_redis(self) -> bool:
        return self.store.startswith(("redis://", "rediss://"))

    @property
    def store_name(self) -> str:
        """The store as logs, errors and /readyz show it: a Redis password masked."""
        return re.sub(r"^(rediss?://[^:@/]*:)[^@/]*@", r"\1***@", self.store)

    def tenant(self, name: str) -> TenantLimits | None:
        """The tenant's limits; tenants not listed get ``default``'s, under their own name."""
        if name in self.tenants:
            return self.tenants[name]
        default = self.tenants.get("default")
        if default is None:
            return None
        return TenantLimits(name, default.rpm, default.tpm, default.max_concurrency,
                            default.budget_usd_month, default.models)


# ---------------------------------------------------------------------------------- loading

TOP_KEYS = {"store", "state_dir", "secret_file", "jwt", "tenants", "models", "max_body_bytes",
            "connect_timeout_s", "upstream_timeout_s", "store_connect_timeout_ms",
            "store_command_timeout_ms", "ledger_max_entries", "ledger_retention_days",
            "concurrency_lease_s", "upstream_max_header_bytes", "upstream_max_error_body_bytes",
            "upstream_max_connections"}
TENANT_KEYS = {"rpm", "tpm", "max_concurrency", "budget_usd_month", "models"}
MODEL_KEYS = {"upstreams", "tenants", "fallback", "default_max_tokens", "priority"}
UPSTREAM_KEYS = {"name", "url", "urls", "weight", "model", "api_key_env", "bedrock", "sagemaker",
                 "usd_per_mtok_input", "usd_per_mtok_output", "balance", "load_bound", "load_floor", "eject_s",
                 "proxy", "ca_file", "cert_file", "key_file", "max_header_bytes",
                 "max_error_body_bytes", "max_connections"}
# An upstream's keys that say how the HTTP client reaches it and what it takes from it.
HTTP_CLIENT_KEYS = ("proxy", "ca_file", "cert_file", "key_file", "max_header_bytes",
                    "max_error_body_bytes", "max_connections")
# An upstream's TLS files, and what each should hold.
TLS_FILES = {"ca_file": "the PEM CA certificates to verify the upstream against",
             "cert_file": "the gateway's client certificate, PEM",
             "key_file": "the client certificate's private key, PEM"}
# The limits, each with its global key and the least it may be.
UPSTREAM_LIMITS = {"max_header_bytes": MIN_MAX_HEADER_BYTES, "max_error_body_bytes": 1,
                   "max_connections": 1}
PRIORITY_KEYS = {"later_steps_first", "session_ttl_s"}
JWT_KEYS = {"jwks_file", "jwks_url", "issuer", "audience", "tenant_claim"}
STORE_KEYS = {"url", "ca_file", "password_env", "password_file", "serverless"}
BEDROCK_KEYS = {"model_id", "region", "endpoint_url"}
SAGEMAKER_KEYS = {"endpoint", "dialect", "region", "endpoint_url"}
# The bodies a SageMaker endpoint may speak (options/contract.py's dialects).
SAGEMAKER_DIALECTS = ("openai-chat", "openai-completions", "tgi", "lmi")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


class _Lines:
    """The line of every key path in the YAML file, for messages."""

    def __init__(self, node) -> None:
        self.lines: dict[str, int] = {}
        if node is not None:
            self._walk(node, "")

    def _walk(self, node, path: str) -> None:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = f"{path}.{key.value}" if path else str(key.value)
                self.lines[sub] = key.start_mark.line + 1
                self._walk(value, sub)
                self.lines[sub] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, f"{path}[{i}]")

    def of(self, path: str) -> int:
        while path and path not in self.lines:
            path = path.rsplit(".", 1)[0] if "." in path else ""
        return self.lines.get(path, 1)


class _Checker:
    def __init__(self, path: Path, lines: _Lines) -> None:
        self.path, self.lines, self.errors = path, lines, []

    def error(self, key: str, message: str) -> None:
        self.errors.append((self.lines.of(key), f"{self.path.name} line {self.lines.of(key)}: "
                                                f"{key}: {message}"))

    def keys(self, where: str, value: dict, known: set) -> None:
        for key in value:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.error(f"{where}.{key}" if where else str(key),
                           f"unknown key; {hint}known keys: {', '.join(sorted(known))}")

    def mapping(self, key: str, value, required: bool = False) -> dict:
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            self.error(key, f"must be a mapping, got {type(value).__name__} {value!r}")
            return {}
        return value

    def number(self, key: str, value, *, integer: bool, minimum: float = 0, allow_none=True):
        if value is None and allow_none:
            return None
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or value < minimum:
            kind = "a whole number" if integer else "a number"
            self.error(key, f"must be {kind} >= {minimum}, got {value!r}")
            return None
        return value

    def string(self, key: str, value, *, allow_none=True):
        if value is None and allow_none:
            return None
        if not isinstance(value, str) or not value:
            self.error(key, f"must be a non-empty string, got {value!r}")
            return None
        return value


def load_config(path: str | os.PathLike) -> GatewayConfig:
    """Read and check ``path``; raises ConfigError naming every bad line and key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read the gateway config {str(path)!r}: {e.strerror}") from None
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path.name}: not valid YAML: {e}") from None
    return config_from_dict(raw, path, _Lines(node))


def config_from_dict(raw: Any, path: Path, lines: _Lines | None = None) -> GatewayConfig:
    check = _Checker(path, lines or _Lines(None))
    raw = check.mapping("", raw, required=True) if raw is not None else {}
    check.keys("", raw, TOP_KEYS)

    base = path.parent
    store, store_options = _store(check, raw.get("store", "memory"), base)
    state_dir = Path(raw.get("state_dir") or base / f"{path.stem}.state")
    if not state_dir.is_absolute():
        state_dir = base / state_dir
    secret_file = Path(raw.get("secret_file") or state_dir / "secret")
    if not secret_file.is_absolute():
        secret_file = base / secret_file

    tenants = {}
    for name, value in check.mapping("tenants", raw.get("tenants")).items():
        key = f"tenants.{name}"
        if not NAME_RE.match(str(name)):
            check.error(key, "a tenant name is letters, digits and . _ : - (it goes into headers)")
        value = check.mapping(key, value)
        check.keys(key, value, TENANT_KEYS)
        models = value.get("models", ["*"])
        if isinstance(models, str):
            models = [models]
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            check.error(f"{key}.models", f"must be a list of model names, got {models!r}")
            models = []
        tenants[str(name)] = TenantLimits(
            name=str(name),
            rpm=check.number(f"{key}.rpm", value.get("rpm"), integer=True, minimum=1),
            tpm=check.number(f"{key}.tpm", value.get("tpm"), integer=True, minimum=1),
            max_concurrency=check.number(f"{key}.max_concurrency", value.get("max_concurrency"),
                                         integer=True, minimum=1),
            budget_usd_month=check.number(f"{key}.budget_usd_month", value.get("budget_usd_month"),
                                          integer=False, minimum=0),
            models=tuple(models))

    # Every HTTP upstream's limits, unless it sets its own.
    limits = {key: check.number(f"upstream_{key}", raw.get(f"upstream_{key}"), integer=True,
                                minimum=least)
              for key, least in UPSTREAM_LIMITS.items()}
    limits = {key: value for key, value in limits.items() if value is not None}

    models = {}
    for name, value in check.mapping("models", raw.get("models")).items():
        models[str(name)] = _model(check, str(name), value, tenants, limits, base)
    if not models:
        check.error("models", "no models: add at least one under models: with its upstreams")

    for tenant in tenants.values():
        for i, model in enumerate(tenant.models):
            if model != "*" and model not in models:
                check.error(f"tenants.{tenant.name}.models[{i}]",
                            f"model {model!r} does not exist; models: {', '.join(sorted(models)) or 'none'}")

    jwt = None
    if raw.get("jwt") is not None:
        value = check.mapping("jwt", raw["jwt"])
        check.keys("jwt", value, JWT_KEYS)
        jwt = JwtSettings(**{k: check.string(f"jwt.{k}", value.get(k)) for k in JWT_KEYS
                             if k in value})
        if not (jwt.jwks_file or jwt.jwks_url):
            check.error("jwt", "needs jwks_file or jwks_url: the keys JWTs are verified against")
        if jwt.jwks_file and not Path(jwt.jwks_file).is_absolute():
            jwt = JwtSettings(str(base / jwt.jwks_file), jwt.jwks_url, jwt.issuer, jwt.audience,
                              jwt.tenant_claim)
        if jwt.jwks_file and not Path(jwt.jwks_file).is_file():
            check.error("jwt.jwks_file", f"{jwt.jwks_file!r} is not a file")

    numbers = {k: check.number(k, raw.get(k), integer=False, minimum=0.001)
               for k in ("connect_timeout_s", "upstream_timeout_s", "store_connect_timeout_ms",
                         "store_command_timeout_ms", "ledger_retention_days")}
    # A lease shorter than a second would be renewed more often than it is worth.
    numbers["concurrency_lease_s"] = check.number(
        "concurrency_lease_s", raw.get("concurrency_lease_s"), integer=False, minimum=1)
    numbers["ledger_max_entries"] = check.number(
        "ledger_max_entries", raw.get("ledger_max_entries"), integer=True, minimum=100)
    max_body = check.number("max_body_bytes", raw.get("max_body_bytes"), integer=True, minimum=1)

    if check.errors:
        raise ConfigError("the gateway config has errors:\n  " +
                          "\n  ".join(m for _, m in sorted(check.errors)))
    return GatewayConfig(
        path=path, store=store, store_options=store_options, state_dir=state_dir, secret_file=secret_file, tenants=tenants,
        models=models, jwt=jwt, max_body_bytes=max_body or DEFAULT_MAX_BODY_BYTES,
        **{k: v for k, v in numbers.items() if v is not None},
        **{f"upstream_{k}": v for k, v in limits.items()})


def _store(check: _Checker, value, base: Path) -> tuple[str, StoreOptions]:
    """``store``: ``memory``, a Redis URL, or a mapping of the URL (``url``) and how to reach
    it (``STORE_KEYS``)."""
    where, raw = "store", {}
    if isinstance(value, dict):
        raw, where = value, "store.url"
        check.keys("store", raw, STORE_KEYS)
        value = raw.get("url")
    if not (value == "memory" or (isinstance(value, str)
                                  and re.match(r"^rediss?://[^/\s]+(/\d+)?$", value))):
        check.error(where, f"{value!r} is not a store; use 'memory' (one process) or "
                           "'redis://HOST:PORT/DB' (shared by workers and replicas)")
        return "memory", StoreOptions()
    options = {k: raw[k] for k in sorted(STORE_KEYS - {"url"}) if k in raw}
    if value == "memory":
        for key in options:
            check.error(f"store.{key}", "applies to a Redis store (url: redis://...), not to memory")
        return value, StoreOptions()
    tls = value.startswith("rediss://")
    db = int(value.rsplit("/", 1)[1]) if re.search(r"/\d+$", value) else 0
    has_password = re.match(r"^rediss?://[^/@]*:[^/@]*@", value) is not None
    for key in ("ca_file", "password_env", "password_file"):
        if check.string(f"store.{key}", options.get(key)) is None:
            options.pop(key, None)

    def path_of(name: str) -> str:
        return name if Path(name).is_absolute() else str(base / name)
    ca_file = options.get("ca_file")
    if ca_file is not None:
        ca_file = path_of(ca_file)
        if not tls:
            check.error("store.ca_file", f"the store URL {value!r} is not TLS: write rediss:// "
                                         "for the CA file to be used")
        elif not Path(ca_file).is_file():
            check.error("store.ca_file", f"{ca_file!r} is not a file (it should be the PEM CA "
                                         "certificate that signed the server's)")
    sources = [k for k in ("password_env", "password_file") if k in options]
    if len(sources) + has_password > 1:
        check.error(f"store.{sources[-1]}", "give the password one way: in the URL, "
                                            "password_env or password_file")
    password_env = options.get("password_env")
    if password_env is not None and password_env not in os.environ:
        check.error("store.password_env", f"the variable {password_env!r} is not set (it should "
                                          "hold the Redis password or IAM auth token)")
    password_file = options.get("password_file")
    if password_file is not None:
        password_file = path_of(password_file)
        if not os.access(password_file, os.R_OK):
            check.error("store.password_file", f"{password_file!r} is not a readable file (it "
                                               "should hold the Redis password or IAM auth token)")
    serverless = options.get("serverless", False)
    if not isinstance(serverless, bool):
        check.error("store.serverless", f"must be true or false, got {serverless!r}")
        serverless = False
    if serverless and db != 0:
        check.error(where, f"database {db}: ElastiCache Serverless has only database 0; end "
                           "the URL with /0")
    if serverless and not tls:
        check.error(where, "ElastiCache Serverless speaks only TLS: write rediss://")
    return value, StoreOptions(ca_file=ca_file, password_env=password_env,
                               password_file=password_file, serverless=serverless)



def _model(check: _Checker, name: str, value, tenants: dict, limits: dict, base: Path) -> Model:
    key = f"models.{name}"
    value = check.mapping(key, value, required=True)
    check.keys(key, value, MODEL_KEYS)
    upstreams = []
    raw_upstreams = value.get("upstreams")
    if not isinstance(raw_upstreams, list) or not raw_upstreams:
        check.error(f"{key}.upstreams", "needs a list of at least one upstream "
                                        "({name, url, weight} or {name, bedrock: {...}, weight})")
        raw_upstreams = []
    for i, u in enumerate(raw_upstreams):
        ukey = f"{key}.upstreams[{i}]"
        u = check.mapping(ukey, u, required=True)
        check.keys(ukey, u, UPSTREAM_KEYS)
        uname = check.string(f"{ukey}.name", u.get("name"), allow_none=False) or f"#{i}"
        if any(x.name == uname for x in upstreams):
            check.error(f"{ukey}.name", f"upstream {uname!r} is listed twice in model {name!r}")
        kinds = [k for k in ("url", "urls", "bedrock", "sagemaker") if u.get(k) is not None]
        if len(kinds) != 1:
            check.error(ukey, f"upstream {uname!r} needs exactly one of url, urls (its "
                              f"replicas), bedrock, sagemaker; got {', '.join(kinds) or 'none'}")
        urls = _urls(check, ukey, u)
        url = urls[0] if urls else None
        balance = u.get("balance", "affinity")
        if balance not in BALANCES:
            check.error(f"{ukey}.balance", f"{balance!r} is not a balance; choose one of "
                                           f"{', '.join(BALANCES)}")
        for replica_key in ("balance", "load_bound", "load_floor", "eject_s"):
            if replica_key in u and not urls:
                check.error(f"{ukey}.{replica_key}", "applies to replicas of an OpenAI-compatible "
                                                     "upstream (url or urls), not to a managed one")
        http_client = _http_client(check, ukey, u, urls, limits, base)
        for kind, known, required in (("bedrock", BEDROCK_KEYS, "model_id"),
                                      ("sagemaker", SAGEMAKER_KEYS, "endpoint")):
            if u.get(kind) is not None:
                sub = check.mapping(f"{ukey}.{kind}", u[kind], required=True)
                check.keys(f"{ukey}.{kind}", sub, known)
                if not sub.get(required):
                    check.error(f"{ukey}.{kind}", f"needs {required}")
                if kind == "sagemaker" and sub.get("dialect", "openai-chat") not in SAGEMAKER_DIALECTS:
                    check.error(f"{ukey}.sagemaker.dialect", f"{sub['dialect']!r} is not a dialect "
                                f"an endpoint can speak; choose one of {', '.join(SAGEMAKER_DIALECTS)}")
        weight = check.number(f"{ukey}.weight", u.get("weight", 1), integer=False, minimum=0)
        upstreams.append(Upstream(
            name=uname, weight=float(weight or 0), url=url, urls=tuple(urls),
            balance=balance if balance in BALANCES else "affinity",
            # c = 1 would be perfect balance: no session could ever keep its replica.
            load_bound=check.number(f"{ukey}.load_bound", u.get("load_bound", DEFAULT_LOAD_BOUND),
                                    integer=False, minimum=1.01) or DEFAULT_LOAD_BOUND,
            load_floor=check.number(f"{ukey}.load_floor", u.get("load_floor", DEFAULT_LOAD_FLOOR),
                                    integer=True, minimum=1) or DEFAULT_LOAD_FLOOR,
            eject_s=check.number(f"{ukey}.eject_s", u.get("eject_s", DEFAULT_EJECT_S),
                                 integer=False, minimum=0) or 0.0,
            model=check.string(f"{ukey}.model", u.get("model")),
            api_key_env=check.string(f"{ukey}.api_key_env", u.get("api_key_env")),
            bedrock=u.get("bedrock"), sagemaker=u.get("sagemaker"),
            usd_per_mtok_input=check.number(f"{ukey}.usd_per_mtok_input",
                                            u.get("usd_per_mtok_input", 0), integer=False) or 0.0,
            usd_per_mtok_output=check.number(f"{ukey}.usd_per_mtok_output",
                                             u.get("usd_per_mtok_output", 0), integer=False) or 0.0,
            **http_client))
    names = [u.name for u in upstreams]
    if upstreams and sum(u.weight for u in upstreams) <= 0:
        check.error(f"{key}.upstreams", "the weights sum to 0, so no upstream would get traffic; "
                                        "give at least one upstream a weight above 0")

    fallback = value.get("fallback", [])
    if isinstance(fallback, str):
        fallback = [fallback]
    if not isinstance(fallback, list):
        check.error(f"{key}.fallback", f"must be a list of upstream names, got {fallback!r}")
        fallback = []
    for i, f in enumerate(fallback):
        if f not in names:
            check.error(f"{key}.fallback[{i}]", f"{f!r} is not an upstream of model {name!r}; "
                                                f"its upstreams: {', '.join(names) or 'none'}")

    overrides = check.mapping(f"{key}.tenants", value.get("tenants"))
    for tenant, target in overrides.items():
        if target not in names:
            check.error(f"{key}.tenants.{tenant}", f"{target!r} is not an upstream of model "
                                                   f"{name!r}; its upstreams: {', '.join(names)}")
        if tenant not in tenants and "default" not in tenants:
            check.error(f"{key}.tenants.{tenant}", f"tenant {tenant!r} is not under tenants: and "
                                                   "there is no default tenant it could come from")
    max_tokens = check.number(f"{key}.default_max_tokens", value.get("default_max_tokens"),
                              integer=True, minimum=1)
    return Model(name=name, upstreams=tuple(upstreams), tenant_overrides=dict(overrides),
                 fallback=tuple(str(f) for f in fallback),
                 default_max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
                 priority=_priority(check, f"{key}.priority", value.get("priority")))


def _http_client(check: _Checker, ukey: str, u: dict, urls: list[str], limits: dict,
                 base: Path) -> dict:
    """An HTTP upstream's proxy, TLS files and limits (the global ``upstream_max_*`` where it
    sets none), checked as the client will use them: the proxy parsed, the TLS files loaded."""
    out = {}
    for key in HTTP_CLIENT_KEYS:
        if key in u and not urls:
            check.error(f"{ukey}.{key}", "applies to an OpenAI-compatible upstream (url or urls), "
                                         "not to a managed one")
    for key, least in UPSTREAM_LIMITS.items():
        value = check.number(f"{ukey}.{key}", u.get(key, limits.get(key)), integer=True,
                             minimum=least)
        if value is not None:
            out[key] = value
    proxy = check.string(f"{ukey}.proxy", u.get("proxy"))
    if proxy:
        try:
            parse_proxy(proxy, "proxy")
            out["proxy"] = proxy
        except ValueError as e:
            check.error(f"{ukey}.proxy", str(e))
    files = {}
    for key in TLS_FILES:
        path = check.string(f"{ukey}.{key}", u.get(key))
        if path is None:
            continue
        if not Path(path).is_absolute():
            path = str(base / path)
        if not Path(path).is_file():
            check.error(f"{ukey}.{key}", f"{path!r} is not a file (it should be {TLS_FILES[key]})")
            continue
        files[key] = path
    named = sum(u.get(k) is not None for k in TLS_FILES)
    if files and len(files) == named:        # (a missing file is named above already)
        if urls and not any(url.startswith("https://") for url in urls):
            check.error(f"{ukey}.{next(iter(files))}", "applies to https:// URLs; this upstream's "
                        "are http://, which has no TLS to verify or authenticate")
        else:
            try:
                tls_context(**files)
                out.update(files)
            except ValueError as e:       # the message begins with the file's key
                culprit = str(e).split(" ", 1)[0]
                check.error(f"{ukey}.{culprit if culprit in files else next(iter(files))}", str(e))
    return out


def _urls(check: _Checker, ukey: str, u: dict) -> list[str]:
    """``url`` as a list of one, or ``urls``: each an http(s) URL, none twice."""
    if u.get("urls") is None:
        url = check.string(f"{ukey}.url", u.get("url"))
        if url and not re.match(r"^https?://", url):
            check.error(f"{ukey}.url", f"{url!r} is not an http(s) URL")
            return []
        return [url] if url else []
    urls = u["urls"]
    if not isinstance(urls, list) or not urls:
        check.error(f"{ukey}.urls", f"must be a list of the replicas' URLs "
                                    f"([http://a:8080, http://b:8080]), got {urls!r}")
        return []
    out = []
    for i, url in enumerate(urls):
        if not isinstance(url, str) or not re.match(r"^https?://", url):
            check.error(f"{ukey}.urls[{i}]", f"{url!r} is not an http(s) URL")
        elif url.rstrip("/") in [o.rstrip("/") for o in out]:
            check.error(f"{ukey}.urls[{i}]", f"{url!r} is listed twice: each replica once")
        else:
            out.append(url)
    return out


def _priority(check: _Checker, key: str, value) -> Priority:
    value = check.mapping(key, value)
    check.keys(key, value, PRIORITY_KEYS)
    later = value.get("later_steps_first", False)
    if not isinstance(later, bool):
        check.error(f"{key}.later_steps_first", f"must be true or false, got {later!r}")
        later = False
    ttl = check.number(f"{key}.session_ttl_s", value.get("session_ttl_s", DEFAULT_SESSION_TTL_S),
                       integer=False, minimum=1)
    return Priority(later_steps_first=later, session_ttl_s=ttl or DEFAULT_SESSION_TTL_S)
