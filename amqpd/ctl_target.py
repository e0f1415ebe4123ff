"""Where ``amqpctl`` finds the broker when it is given no ``--url``: the broker's settings.

``rabbitmqctl`` on a broker's machine reaches that node with no arguments because it
reads the same environment files as the server. ``amqpctl`` does the same with amqpd's
settings, through the very code the broker uses (:func:`amqpd.config.load_settings`):

* the config file: ``--config``, else ``$AMQPD_CONFIG``, else :data:`DEFAULT_CONFIG`
  (the one etc/amqpd.service gives the broker) when it exists, else none;
* the ``AMQPD_*`` environment variables, over the file, as for the broker.

From those it takes the HTTP API's address (``http_bind`` or ``bind``; a wildcard
address means this machine, reached over loopback), ``http_port``, ``http_tls`` and the
default user's credentials (``default_user``/``default_pass``, the administrator the
broker creates at first boot). Over HTTPS it trusts the certificate the broker serves
(``tls_cert``), pinned: only that exact certificate is accepted, so the host name in
it need not be the loopback address amqpctl connects to. ``--cacert`` verifies against
a CA instead, host name included.

An explicit ``--url`` (or ``$AMQPCTL_URL``) skips all of this, as before.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from amqpd.config import ConfigError, Settings, load_settings

DEFAULT_CONFIG = "/etc/amqpd/amqpd.toml"
# Target.origin when neither a config file nor an AMQPD_* variable was found
DEFAULTS_ORIGIN = "amqpd's default settings"

_SETTING_VARIABLES = frozenset(f"AMQPD_{f.name.upper()}" for f in fields(Settings))

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


class Unreadable(ConfigError):
    """The config file (or the certificate it names) does not exist or cannot be read."""


class NoApi(ConfigError):
    """The settings do not give an HTTP API amqpctl can reach."""


@dataclass(frozen=True, slots=True)
class Target:
    """A broker's HTTP API and how to log in to it."""

    url: str
    username: str
    password: str
    pinned_cert: bytes | None  # PEM of the one certificate an https API must present
    origin: str  # where the address came from, for error messages


def config_path(explicit: str | None, environ: Mapping[str, str]) -> str | None:
    """The config file the broker on this machine reads, as far as amqpctl can tell."""
    if explicit:
        return explicit
    if environ.get("AMQPD_CONFIG"):
        return environ["AMQPD_CONFIG"]
    return DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None


def _local_host(address: str) -> str:
    """The address to connect to for a listener bound to ``address``."""
    if address in ("", "0.0.0.0"):
        return "127.0.0.1"
    if address == "::":
        return "[::1]"
    return f"[{address}]" if ":" in address else address


def from_settings(settings: Settings, origin: str) -> Target:
    if not settings.management:
        raise NoApi(f"{origin} turns the HTTP API off (management = false): amqpctl needs "
                    "it; pass --url to reach another broker")
    if settings.http_port == 0:
        raise NoApi(f"{origin} gives http_port = 0 (a port picked at start-up): pass --url "
                    "with the port the broker reports")
    host = _local_host(settings.http_bind or settings.bind)
    pinned = None
    if settings.http_tls:
        pinned = _first_certificate(settings.tls_cert, origin)
    scheme = "https" if settings.http_tls else "http"
    return Target(url=f"{scheme}://{host}:{settings.http_port}",
                  username=settings.default_user, password=settings.default_pass,
                  pinned_cert=pinned, origin=origin)


def discover(config: str | None, environ: Mapping[str, str] | None = None) -> Target:
    """The local broker's API from its config file and ``AMQPD_*`` variables."""
    env = os.environ if environ is None else environ
    path = config_path(config, env)
    if path is not None:
        try:
            Path(path).read_bytes()
        except OSError as exc:
            raise Unreadable(f"cannot read the broker's config file {path}: "
                             f"{exc.strerror or exc} (pass --url, or run amqpctl as a user "
                             "that may read it)") from None
    settings = load_settings(path, environ=dict(env))
    variables = sorted(_SETTING_VARIABLES.intersection(env))
    origin = " and ".join(filter(None, [
        f"config file {path}" if path else "",
        f"environment ({', '.join(variables)})" if variables else "",
    ])) or DEFAULTS_ORIGIN
    return from_settings(settings, origin)


def _first_certificate(path: str, origin: str) -> bytes:
    if not path:
        raise NoApi(f"{origin} serves the HTTP API over TLS (http_tls) but names no "
                    "tls_cert")
    try:
        match = _PEM.search(Path(path).read_bytes())
    except OSError as exc:
        raise Unreadable(f"cannot read the broker's certificate {path}: "
                         f"{exc.strerror or exc}") from None
    if match is None:
        raise ConfigError(f"no PEM certificate in {path} (tls_cert in {origin})")
    return match.group(0)


def pinned_context(pem: bytes) -> ssl.SSLContext:
    """Accept exactly the certificate in ``pem``, whatever host name it carries."""
    ctx = ssl.create_default_context(cadata=pem.decode("ascii"))
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf itself is the anchor
    ctx.check_hostname = False  # the exact certificate is required instead
    return ctx
