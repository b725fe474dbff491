"""Every gRPC service of a job checks the caller's token before it reads a request's body, and
never runs with an empty or short token; the token never shows in a repr.

A worker's Peer service takes messages up to 2 GiB (a part of a model travels as one): when
its token check ran after the body was read, one unauthenticated 96 MiB call raised the
worker's peak memory from 62 to 359 MB. The measure here: the peak RSS of a real server
process before and after such a call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import grpc
import pytest

from iterreduce.master import Master, MasterConfig
from iterreduce.transport import exchange, security
from iterreduce.transport.security import TokenError
from iterreduce.transport.security import new_token

BODY_BYTES = 96 << 20
#: what an unauthenticated call may add to the server's peak memory (gRPC's buffers, a thread)
ALLOWED_GROWTH_BYTES = 16 << 20

#: a child that serves the Peer service (or the master's) with a token, and answers "peak" on stdin
#: with its peak resident memory
_SERVER = textwrap.dedent("""
    import json, sys
    from iterreduce.transport import exchange
    from iterreduce.master import Master, MasterConfig
    kind, token = sys.argv[1], sys.argv[2]
    if kind == "peer":
        server, address = exchange.serve(exchange.Inbox(), token, "127.0.0.1", "127.0.0.1")
    else:
        master = Master(MasterConfig(program="softmax_program:SoftmaxRegression", program_config={},
                                     shards=[], workers=1, token=token, output=sys.argv[3], ui=False))
        server, address = master.serve()
    print(address, flush=True)
    for line in sys.stdin:  # VmHWM: this process's own peak (ru_maxrss counts its parent's before exec)
        status = open("/proc/self/status").read()
        print(int(status.split("VmHWM:")[1].split()[0]) * 1024, flush=True)
""")


class Server:
    """A server in a child process, with its peak RSS on request."""

    def __init__(self, kind: str, token: str, output: str = ""):
        env = dict(os.environ, GRPC_VERBOSITY="NONE")
        self.process = subprocess.Popen([sys.executable, "-c", _SERVER, kind, token, output], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)
        self.address = self.process.stdout.readline().strip()
        assert self.address, "the server did not start"

    def peak(self) -> int:
        self.process.stdin.write("peak\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def call(address: str, method: str, body: bytes, token: str | None) -> grpc.RpcError:
    """A unary call of ``method`` with ``body`` (and ``token``, if any): the error it ends with."""
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", len(body) + 1024)]) as channel:
        stub = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            stub(body, metadata=security.metadata(token) if token is not None else None, timeout=60)
    return info.value


@pytest.mark.parametrize("token", [None, "a wrong token of the right length!"], ids=["none", "wrong"])
def test_an_unauthenticated_96_mib_call_to_the_peer_service_is_refused_unread(token):
    server = Server("peer", new_token())
    try:
        body = bytes(BODY_BYTES)
        before = server.peak()
        for _ in range(3):
            error = call(server.address, f"/{exchange.SERVICE}/{exchange.METHOD}", body, token)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
        after = server.peak()
        print(f"peak RSS {before >> 20} -> {after >> 20} MiB")
        assert after - before < ALLOWED_GROWTH_BYTES, f"peak RSS {before >> 20} -> {after >> 20} MiB"
    finally:
        server.close()


def test_an_unauthenticated_call_to_the_master_is_refused_unread(tmp_path):
    """The master takes messages of a few MiB only; its body is not read before the token either."""
    server = Server("master", new_token(), str(tmp_path))
    try:
        for method in ("/iterreduce.Master/Register", "/iterreduce.Master/Heartbeat"):
            call(server.address, method, bytes(3 << 20), None)  # gRPC's threads and pools, once (not per call)
            before = server.peak()
            for _ in range(20):  # 60 MiB sent
                error = call(server.address, method, bytes(3 << 20), None)
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error
            assert server.peak() - before < ALLOWED_GROWTH_BYTES
    finally:
        server.close()


def test_authenticated_parts_still_arrive():
    token = new_token()
    inbox = exchange.Inbox()
    server, address = exchange.serve(inbox, token, "127.0.0.1", "127.0.0.1")
    peers = exchange.Peers("worker-1", token)
    try:
        import numpy as np

        message = peers.encode(exchange.UPDATE, 4, 0, {"w": np.arange(6, dtype=np.float32)}, float16=False)
        peers.send(address, message).result()
        received = inbox.wait(4, exchange.UPDATE, 0, ["w"], timeout=10)
        assert received is not None and received["w"].tolist() == list(range(6))
    finally:
        peers.close()
        server.stop(None)


def test_the_interceptor_refuses_with_handlers_that_do_not_read_the_request():
    interceptor = security.TokenInterceptor(new_token())

    class Details:
        method = "/x/y"
        invocation_metadata = ()

    for handler in (grpc.unary_unary_rpc_method_handler(lambda r, c: r),
                    grpc.unary_stream_rpc_method_handler(lambda r, c: iter(())),
                    grpc.stream_unary_rpc_method_handler(lambda r, c: r),
                    grpc.stream_stream_rpc_method_handler(lambda r, c: r)):
        denied = interceptor.intercept_service(lambda details: handler, Details())
        assert denied.request_streaming  # gRPC reads a request message only when asked for it
        assert denied.response_streaming == handler.response_streaming
    assert interceptor.intercept_service(lambda details: None, Details()) is None  # unknown method: gRPC's answer


# ------------------------------------------------------------------ empty and short tokens


@pytest.mark.parametrize("token", ["", "short", "x" * (security.MIN_TOKEN_CHARS - 1)])
def test_no_service_starts_with_an_empty_or_short_token(token, tmp_path):
    with pytest.raises(TokenError, match=rf"job token of {len(token)} characters: at least "
                                         rf"{security.MIN_TOKEN_CHARS} are needed"):
        security.TokenInterceptor(token)
    with pytest.raises(TokenError):
        exchange.serve(exchange.Inbox(), token, "127.0.0.1", "127.0.0.1")
    master = Master(MasterConfig(program="softmax_program:SoftmaxRegression", program_config={},
                                 shards=[], workers=1, token=token, output=str(tmp_path), ui=False))
    with pytest.raises(TokenError):
        master.serve()


def test_master_and_worker_commands_refuse_an_empty_token(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"program": "softmax_program:SoftmaxRegression", "program_config": {},
                               "shards": [], "workers": 1, "output": str(tmp_path / "out")}))
    env = {k: v for k, v in os.environ.items() if k != "ITERREDUCE_TOKEN"}
    for command in ([sys.executable, "-m", "iterreduce.master", str(job)],
                    [sys.executable, "-m", "iterreduce.worker", "--master", "127.0.0.1:1", "--name", "w",
                     "--peer-host", "127.0.0.1"]):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 1, done.stderr
        assert "job token of 0 characters" in done.stderr and "ITERREDUCE_TOKEN" in done.stderr, done.stderr


def test_the_token_is_not_in_the_master_configs_repr():
    token = new_token()
    config = MasterConfig(program="p", program_config={}, shards=[], workers=1, token=token, output="out")
    assert token not in repr(config) and token not in str(config)
    assert config.to_dict()["token"] == token  # the launcher still hands it on (in the environment)


def test_the_token_is_in_no_file_a_local_job_writes(tmp_path):
    """A job on the local mini-cluster (real processes): its token travels in the environment
    only, never in the job file, the log, checkpoints or any other file of the output folder."""
    from conftest_runtime import SOFTMAX, blobs
    from iterreduce.launch.local import run_local
    from shardio.shards import write_shards

    X, y = blobs(60, d=4, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 2)
    token = new_token()
    out = run_local(MasterConfig(program=SOFTMAX, program_config={"n_classes": 3, "epochs": 2}, shards=uris,
                                 workers=2, token=token, output=str(tmp_path / "out"), heartbeat_interval=0.2,
                                 ui=False))
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "job.json" for p in files) and any(p.suffix == ".npz" for p in files)
    assert [p for p in files if token.encode() in p.read_bytes()] == []
