"""The per-job token every caller must present, as gRPC metadata, and the mutual-TLS
credentials master and workers use on YARN (the application's own certificate)."""

from __future__ import annotations

import hmac
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ..exceptions import IterReduceError

TOKEN_KEY = "x-iterreduce-token"
log = logging.getLogger("iterreduce.security")


def new_token() -> str:
    """A random token for one job."""
    return secrets.token_urlsafe(32)


#: the fewest characters a job token may have (:func:`new_token` makes 43): an empty or short token
#: would let callers that present none, or guess one, through
MIN_TOKEN_CHARS = 16


class TokenError(IterReduceError, ValueError):
    """A job token too short to protect a service (empty: the launcher gave none)."""


def check_token(token: str, where: str = "job token") -> str:
    """``token`` when it may protect a service; :class:`TokenError` naming ``where`` (and never
    the token itself) when it is not a string of at least :data:`MIN_TOKEN_CHARS` characters."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS:
        length = len(token) if isinstance(token, str) else type(token).__name__
        raise TokenError(f"{where}: job token of {length} characters: at least {MIN_TOKEN_CHARS} are needed "
                         f"(a launcher makes one per job: iterreduce.transport.security.new_token)")
    return token


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls without the job's token, logging who tried and why, before any of the
    request is read.

    gRPC runs interceptors when a call's metadata (which carries the token) has arrived and
    before it reads a request message, but a unary handler reads the whole request, up to the
    server's message limit, before it runs: a refused call would still make the server take in
    its body (96 MiB raised a worker's peak memory by 300 MB). A refused call therefore gets a
    handler that takes a request *stream* and never reads from it: gRPC reads a message of a
    stream only when the handler asks for the next, so the body is never taken in (HTTP/2's
    flow control stops the sender at its window) and the call ends with UNAUTHENTICATED. Raises
    :class:`TokenError` for an empty or short ``token``."""

    def __init__(self, token: str):
        self._token = check_token(token).encode()

        def deny(requests, context):  # never iterates ``requests``: no message is read
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")

        def deny_stream(requests, context):
            deny(requests, context)
            yield  # noqa: unreachable - makes this a generator, as a streaming response handler is

        self._deny = grpc.stream_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny_stream)

    def intercept_service(self, continuation, details):
        """The method's handler for a caller with the token; one that refuses, unread, otherwise."""
        given = dict(details.invocation_metadata).get(TOKEN_KEY, "")
        if isinstance(given, str) and hmac.compare_digest(given.encode(), self._token):
            return continuation(details)
        log.warning("rejected %s: %s token", details.method, "missing" if not given else "wrong")
        handler = continuation(details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED, reading nothing
            return None
        return self._deny_stream if handler.response_streaming else self._deny


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
