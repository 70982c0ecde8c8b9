"""Where the manager is and how to authenticate to it."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

__all__ = ["DEFAULT_ADDR", "DEFAULT_TOKEN", "HEALTH_ENV", "REVISION_ENV", "TLS", "Config", "ConfigError",
           "parse_addr", "parse_listen_addr", "revision_from_env"]

REVISION_ENV = "CTRLHUB_REVISION"
"""The environment variable an unset ``revision`` of a controller is read from."""

HEALTH_ENV = "CTRLHUB_HEALTH_ADDR"
"""The environment variable naming the address of the health endpoint (e.g. ``0.0.0.0:8081``)."""

DEFAULT_ADDR = "127.0.0.1:9090"
"""The manager of ``ctrlhub dev``."""
DEFAULT_TOKEN = "dev"
"""The static token ``ctrlhub dev`` accepts."""


class ConfigError(ValueError):
    """Invalid connection settings: the message says which and how to fix them."""


@dataclass(frozen=True)
class TLS:
    """PEM files for TLS to the manager, read anew on every connect (so rotated certificates
    take effect). ``cert_file`` and ``key_file`` (both or neither) are the client certificate for
    a manager started with ``--grpc-client-ca`` (mutual TLS)."""

    ca_file: Path | None = None
    """The CA of the manager's serving certificate; None: gRPC's bundled roots."""
    cert_file: Path | None = None
    """This controller's client certificate (mutual TLS)."""
    key_file: Path | None = None
    """The client certificate's private key."""
    server_name: str | None = None
    """The name to verify in the manager's certificate when it is not the address's host."""

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError(
                "a client certificate needs its key and a key its certificate: set both "
                "CTRLHUB_TLS_CERT_FILE and CTRLHUB_TLS_KEY_FILE (cert_file and key_file), or neither"
            )

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files as they are now."""

        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as err:
                raise ConfigError(f"cannot read TLS file {path}: {err.strerror}") from err

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


def parse_addr(addr: str) -> tuple[str, bool]:
    """``(host:port, tls)`` from ``host:port``, ``http://host:port`` or ``https://host:port``.

    >>> parse_addr("http://127.0.0.1:9090")
    ('127.0.0.1:9090', False)
    >>> parse_addr("https://ctrlhub.ctrlhub-system.svc:9090/")
    ('ctrlhub.ctrlhub-system.svc:9090', True)
    """
    text = addr.strip()
    tls = False
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme.lower() not in ("http", "https"):
            raise ConfigError(f"invalid manager address {addr!r}: the scheme must be http:// or https://, not {scheme}://")
        tls = scheme.lower() == "https"
        text = rest
    text = text.rstrip("/")
    if "/" in text or not text:
        raise ConfigError(f"invalid manager address {addr!r}: expected host:port, http://host:port or https://host:port")
    host, colon, port = text.rpartition(":")
    if not colon or not host:
        raise ConfigError(f"invalid manager address {addr!r}: no port; expected host:port (the manager's gRPC port, 9090 by default)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"invalid manager address {addr!r}: port {port!r} is not a number from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ConfigError(f"invalid manager address {addr!r}: {host} is not an IPv6 address") from None
    elif ":" in host:
        raise ConfigError(f"invalid manager address {addr!r}: write an IPv6 host in brackets, e.g. [::1]:9090")
    return f"{host}:{port}", tls


def parse_listen_addr(addr: str) -> tuple[str, int]:
    """``(host, port)`` to listen on from ``host:port``, ``:port`` (every address) or
    ``[::]:port``.

    >>> parse_listen_addr("0.0.0.0:8081")
    ('0.0.0.0', 8081)
    """
    host, colon, port = addr.strip().rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"invalid health address {addr!r} ({HEALTH_ENV}): expected host:port, e.g. 0.0.0.0:8081")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class Config:
    """Connection settings. ``Config.from_env()`` reads the standard variables.

    The token file, when set, is read again on every connect and every cached read (the
    kubelet rotates projected ServiceAccount tokens); it takes precedence over ``token``.
    """

    addr: str = DEFAULT_ADDR
    """``host:port``, ``http://host:port`` or ``https://host:port`` (TLS)."""
    token: str = DEFAULT_TOKEN
    """The static bearer token (``--auth static``)."""
    token_file: Path | None = None
    """A file holding the bearer token (``--auth kubernetes``: a projected token)."""
    tls: TLS | None = None
    """TLS settings; an ``https://`` address without them uses gRPC's bundled roots."""
    reconnect_initial: float = 0.1
    """First reconnect delay in seconds (jittered to half of it up to all of it), doubling."""
    reconnect_max: float = 5.0
    """Upper bound of the reconnect delay, in seconds."""
    keepalive: float = 30.0
    """HTTP/2 keepalive ping interval in seconds, so a dead manager is noticed."""
    drain_grace: float = 10.0
    """After a Drain, how long to wait for the manager to end the stream once every handler
    has answered."""
    shutdown_grace: float = 25.0
    """After SIGTERM (``stop``), how long running handlers may take to finish (those reaching
    their deadline are cancelled then, as always). Handlers still running after it are
    cancelled; one still running a second later is left behind and ``run`` exits with status 1.
    The default fits Kubernetes' default ``terminationGracePeriodSeconds`` of 30 s: keep the
    pod's grace period a few seconds longer than this."""
    outdated_retry: float = 30.0
    """After ``Revoked(SUPERSEDED)`` or ``Rejected`` with ``outdated`` (another definition of
    the controller runs under a higher or equal revision), or ``ALREADY_EXISTS`` (another
    identity of the tenant holds the name), how long to wait before registering again, in
    seconds."""
    health_addr: str | None = None
    """Where to serve ``/healthz`` and ``/readyz`` (``host:port``, e.g. ``0.0.0.0:8081``);
    None: no health endpoint."""
    health_stuck_after: float = 10.0
    """``/healthz`` answers 500 once the event loop has not run for this many seconds."""
    target: str = field(init=False, repr=False)
    secure: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        target, secure = parse_addr(self.addr)
        if self.tls is not None and not secure:
            if "://" in self.addr:
                raise ConfigError(f"TLS files are set but the address {self.addr} is http://; use https://")
            secure = True  # host:port with TLS files: TLS
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "secure", secure)
        if self.token_file is not None:
            path = Path(self.token_file)
            object.__setattr__(self, "token_file", path)
            if not path.is_file():
                raise ConfigError(f"token file {path} does not exist (CTRLHUB_TOKEN_FILE)")
        else:
            _check_token(self.token)
        if self.reconnect_initial <= 0 or self.reconnect_max < self.reconnect_initial:
            raise ConfigError("reconnect delays must be positive, the initial one at most the maximum")
        if self.health_addr is not None:
            parse_listen_addr(self.health_addr)
        if self.shutdown_grace < 0 or self.drain_grace < 0 or self.outdated_retry <= 0:
            raise ConfigError("shutdown_grace and drain_grace must not be negative, outdated_retry must be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Settings from ``CTRLHUB_ADDR``, ``CTRLHUB_TOKEN``, ``CTRLHUB_TOKEN_FILE``,
        ``CTRLHUB_TLS_CA_FILE`` / ``CTRLHUB_TLS_CERT_FILE`` / ``CTRLHUB_TLS_KEY_FILE`` /
        ``CTRLHUB_TLS_SERVER_NAME`` and ``CTRLHUB_HEALTH_ADDR``, defaulting to ``ctrlhub
        dev``'s address and token and no health endpoint."""
        env = os.environ if env is None else env

        def var(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        ca, cert, key, name = (var(f"CTRLHUB_TLS_{v}") for v in ("CA_FILE", "CERT_FILE", "KEY_FILE", "SERVER_NAME"))
        tls = None
        if ca or cert or key or name:
            tls = TLS(
                ca_file=Path(ca) if ca else None,
                cert_file=Path(cert) if cert else None,
                key_file=Path(key) if key else None,
                server_name=name,
            )
        token_file = var("CTRLHUB_TOKEN_FILE")
        return cls(
            addr=var("CTRLHUB_ADDR") or DEFAULT_ADDR,
            token=var("CTRLHUB_TOKEN") or DEFAULT_TOKEN,
            token_file=Path(token_file) if token_file else None,
            tls=tls,
            health_addr=var(HEALTH_ENV),
        )

    def authorization(self) -> str:
        """The ``authorization`` metadata value, with the token file read now."""
        if self.token_file is None:
            return f"Bearer {self.token}"
        try:
            token = self.token_file.read_text().strip()
        except OSError as err:
            raise ConfigError(f"cannot read token file {self.token_file}: {err.strerror}") from err
        _check_token(token, f"token file {self.token_file}")
        return f"Bearer {token}"

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the current token."""
        return (("authorization", self.authorization()),)

    def channel(self, target: str | None = None) -> grpc.aio.Channel:
        """A new channel on a new connection (TLS files read now), to the configured address,
        or to ``target``: a ring member's owner address (``host:port``) that a redirect named.
        A redirect's channel has the same credentials and TLS settings, with its own host as the
        TLS server name (``TLS.server_name`` names the configured address's certificate).

        A local subchannel pool makes it a new TCP connection even when another channel to the
        same target exists: gRPC C-core otherwise shares connections between channels, and a
        session re-opened on the old connection keeps reaching a manager that stepped down.
        """
        server_name = self.tls.server_name if self.tls is not None else None
        if target is not None:
            target, _ = parse_addr(target)  # the scheme, if any, is ignored: TLS is the configured one
            server_name = None
        else:
            target = self.target
        options: list[tuple[str, int | str]] = [
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.keepalive_time_ms", int(self.keepalive * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ]
        if not self.secure:
            return grpc.aio.insecure_channel(target, options=options)
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        return grpc.aio.secure_channel(target, (self.tls or TLS()).credentials(), options=options)


def revision_from_env(env: Mapping[str, str] | None = None) -> int:
    """``Register.revision`` from ``CTRLHUB_REVISION`` (0 when unset or empty)."""
    env = os.environ if env is None else env
    text = env.get(REVISION_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) >= 2**64:
        raise ConfigError(f"{REVISION_ENV}={text!r}: the revision must be a whole number from 0 to 2^64-1, e.g. 2")
    return int(text)


def _check_token(token: str, what: str = "token") -> None:
    if not token:
        raise ConfigError(f"the {what} is empty")
    if not token.isascii() or not token.isprintable():
        raise ConfigError(f"the {what} must be printable ASCII (it is sent as gRPC metadata)")
