"""TLS contexts for the amqps listener and the HTTPS API, from cert/key/CA files.

``tls_verify_peer`` asks clients for a certificate and checks it against ``tls_ca``;
``tls_fail_if_no_peer_cert`` additionally refuses clients that present none (RabbitMQ's
``ssl_options.verify = verify_peer`` / ``fail_if_no_peer_cert = true``).
"""

from __future__ import annotations

import datetime as dt
import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqpd.config import Settings


class TLSConfigError(ValueError):
    pass


def tls_configured(settings: Settings) -> bool:
    return bool(settings.tls_cert and settings.tls_key)


def server_context(settings: Settings) -> ssl.SSLContext:
    if not tls_configured(settings):
        raise TLSConfigError("TLS needs both tls_cert and tls_key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
        if settings.tls_ca:
            ctx.load_verify_locations(settings.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot load TLS certificate/key/CA: {exc}") from exc
    if settings.tls_verify_peer or settings.tls_fail_if_no_peer_cert:
        if not settings.tls_ca:
            raise TLSConfigError("tls_verify_peer needs tls_ca")
        ctx.verify_mode = (ssl.CERT_REQUIRED if settings.tls_fail_if_no_peer_cert
                           else ssl.CERT_OPTIONAL)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def certificate_expires_within(settings: Settings, days: int) -> list[dict[str, str]]:
    """The configured certificates whose notAfter is within ``days`` from now."""
    paths = [p for p in (settings.tls_cert, settings.tls_ca) if p]
    if not paths:
        return []
    try:
        from cryptography import x509
    except ImportError:
        return []
    limit = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    out = []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                certs = x509.load_pem_x509_certificates(fh.read())
        except (OSError, ValueError):
            continue
        for cert in certs:
            if cert.not_valid_after_utc <= limit:
                out.append({"file": path, "subject": cert.subject.rfc4514_string(),
                            "not_after": cert.not_valid_after_utc.isoformat()})
    return out


_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
          "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
          "domainComponent": "DC", "userId": "UID", "streetAddress": "STREET"}


def login_from_certificate(cert: dict[str, Any] | None, login_from: str) -> str:
    """The user name a verified client certificate gives (rabbitmq_auth_mechanism_ssl's
    ``ssl_cert_login_from``): its subject's common name, or the whole distinguished
    name (RFC 4514 order, most specific first: ``CN=guest,O=example``). ``cert`` is
    ``SSLObject.getpeercert()``; "" when there is none or it has no common name."""
    if not cert:
        return ""
    rdns = cert.get("subject", ())
    if login_from == "common_name":
        for rdn in rdns:
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return ""
    parts = []
    for rdn in reversed(rdns):
        parts.append("+".join(f"{_SHORT.get(k, k)}={_escape(str(v))}" for k, v in rdn))
    return ",".join(parts)


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    return out
