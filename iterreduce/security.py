"""The per-job token every caller must present, as gRPC metadata, and the mutual-TLS
credentials master and workers use on YARN (the application's own certificate)."""

from __future__ import annotations

import hmac
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import grpc

TOKEN_KEY = "x-iterreduce-token"
log = logging.getLogger("iterreduce.security")


def new_token() -> str:
    """A random token for one job."""
    return secrets.token_urlsafe(32)


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls without the job's token, logging who tried and why."""

    def __init__(self, token: str):
        self._token = token.encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_unary_rpc_method_handler(lambda it, ctx: deny(None, ctx))
        self._deny_out = grpc.unary_stream_rpc_method_handler(lambda req, ctx: deny(req, ctx))

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata).get(TOKEN_KEY, "")
        if hmac.compare_digest(given.encode(), self._token):
            return continuation(details)
        log.warning("rejected %s: %s token", details.method, "missing" if not given else "wrong")
        handler = continuation(details)
        if handler is None:
            return None
        if handler.request_streaming:
            return self._deny_stream
        if handler.response_streaming:
            return self._deny_out
        return self._deny


def metadata(token: str) -> tuple:
    """Call metadata carrying ``token``."""
    return ((TOKEN_KEY, token),)


@dataclass(frozen=True)
class TlsCredentials:
    """A PEM certificate and its private key. Both ends of a connection present the same
    self-signed pair and trust only it, so only holders of the key can connect."""

    cert: bytes
    key: bytes = field(repr=False)  # never in a log or a traceback


def server_credentials(tls: TlsCredentials) -> grpc.ServerCredentials:
    """Server side: present ``tls.cert`` and accept only clients that present it too."""
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.cert,
                                       require_client_auth=True)


def channel_credentials(tls: TlsCredentials) -> grpc.ChannelCredentials:
    """Client side: trust only ``tls.cert`` and present it as the client certificate."""
    return grpc.ssl_channel_credentials(root_certificates=tls.cert, private_key=tls.key,
                                        certificate_chain=tls.cert)


def open_channel(address: str, tls: TlsCredentials | None = None, max_message_bytes: int = 4 << 20) -> grpc.Channel:
    """A channel to ``address``: mutual TLS with ``tls``, plaintext without (the loopback cluster);
    messages up to ``max_message_bytes`` either way."""
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes)]
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, channel_credentials(tls), options=options + channel_options(tls))


def channel_options(tls: TlsCredentials) -> list[tuple[str, str]]:
    """Channel options that check the server's certificate against its own name, not the host's
    (skein's certificate names ``skein-internal``, whatever host the master runs on)."""
    return [("grpc.ssl_target_name_override", certificate_name(tls.cert))]


def certificate_name(cert: bytes) -> str:
    """The name a certificate is issued to: its first DNS subject alternative name, else its CN."""
    from cryptography import x509  # skein's dependency; only needed with TLS
    from cryptography.x509.oid import NameOID

    parsed = x509.load_pem_x509_certificate(cert)
    try:
        names = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = names.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    if dns:
        return dns[0]
    common = parsed.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not common:
        raise ValueError("TLS certificate has neither a DNS name nor a common name")
    return str(common[0].value)


def from_skein(security) -> TlsCredentials:
    """The pair a ``skein.Security`` holds, as bytes or as local files. In a YARN container,
    ``skein.ApplicationClient.from_current().security`` is the application's own pair (the
    container's ``.skein.crt`` / ``.skein.pem``). Raises FileNotFoundError naming a missing file."""
    return TlsCredentials(_skein_bytes(security, "cert"), _skein_bytes(security, "key"))


def _skein_bytes(security, kind: str) -> bytes:
    data = getattr(security, f"{kind}_bytes", None)
    if data:
        return data
    source = getattr(getattr(security, f"{kind}_file", None), "source", None)
    if not source:
        raise ValueError(f"skein security has no TLS {kind}")
    if not source.startswith("file://"):
        raise ValueError(f"TLS {kind} file {source} is not on this machine")
    path = Path(source[len("file://"):])
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"TLS {kind} file {path} is missing") from None
    if not data.strip():
        raise ValueError(f"TLS {kind} file {path} is empty")
    return data
