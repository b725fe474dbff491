"""The master's gRPC server: its RPCs behind the token check, with the shared broadcast's
bytes sent as they are."""

from __future__ import annotations

from concurrent import futures

import grpc

from ..proto import iterreduce_pb2 as pb
from ..proto import iterreduce_pb2_grpc as pb_grpc
from ..transport import wire
from ..transport.security import TokenInterceptor
from .broadcast import task_chunk_bytes


def master_server(servicer: pb_grpc.MasterServicer, workers: int, token: str) -> grpc.Server:
    """A gRPC server (not started, bound to no port) of ``servicer``'s RPCs, for ``workers``
    workers, each call checked for ``token``."""
    options = [("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4 * workers + 8),
                         interceptors=[TokenInterceptor(token)], options=options)
    add_servicer(servicer, server)
    return server


def add_servicer(servicer: pb_grpc.MasterServicer, server: grpc.Server) -> None:
    """``pb_grpc.add_MasterServicer_to_server``, built from the same service descriptor, except
    that FetchTask may yield serialized chunks (the same messages on the wire, for the same
    clients)."""
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    service = pb.DESCRIPTOR.services_by_name["Master"]
    handlers = {}
    for method in service.methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = kinds[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=request.FromString,
            response_serializer=task_chunk_bytes if method.name == "FetchTask" else response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):  # grpcio >= 1.63, as the generated code does
        server.add_registered_method_handlers(service.full_name, handlers)
