"""The per-job token every caller must present, as gRPC metadata."""

from __future__ import annotations

import hmac
import logging
import secrets

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
