"""TLS for SSL and SASL_SSL listeners with the standard library's ``ssl``:
the server context (TLS 1.2 or newer, the broker's certificate chain and key
as PEM files, optional client-certificate checking against a CA file) and
the principal a client certificate stands for.

``ssl.client.auth``: ``none`` asks for no certificate; ``requested`` asks,
and checks one if sent; ``required`` refuses a client without a certificate
the CA file vouches for. On an SSL listener a client that presented a
certificate is ``User:<the certificate subject's CN>`` (Kafka's default
principal builder would use the whole distinguished name; the CN is what
users write in ACLs here); without one it is ``User:ANONYMOUS``. On SASL_SSL
the SASL exchange decides the principal.
"""

from __future__ import annotations

import ssl

from broker.security.session import ANONYMOUS, KafkaPrincipal

_VERIFY_MODES = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """The TLS settings cannot make a server context (said in the message)."""


def server_context(*, certfile: str | None, keyfile: str | None, cafile: str | None, client_auth: str = "none") -> ssl.SSLContext:
    if not certfile:
        raise TlsConfigError("an SSL or SASL_SSL listener needs a certificate (--ssl-certfile, PEM)")
    if client_auth != "none" and not cafile:
        raise TlsConfigError(f"ssl.client.auth={client_auth} needs the CAs to check client certificates against (--ssl-cafile)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
        if cafile:
            context.load_verify_locations(cafile)
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(f"cannot load the TLS certificate, key or CA file: {error}") from None
    context.verify_mode = _VERIFY_MODES[client_auth]
    return context


def principal_from_certificate(certificate: dict | None) -> KafkaPrincipal:
    """``User:<CN>`` of a verified peer certificate (``getpeercert()``), or
    ANONYMOUS when there is none or it has no CN."""
    if not certificate:
        return ANONYMOUS
    for relative_name in certificate.get("subject", ()):
        for key, value in relative_name:
            if key == "commonName" and value:
                return KafkaPrincipal("User", value)
    return ANONYMOUS
