"""Mutual TLS between master and workers, as on YARN: real gRPC on 127.0.0.1, no YARN.

Credentials come from ``skein.Security.new_credentials()``, as each skein application's
do: A is "this application's", B another application's. Only callers presenting A get
through the handshake, and they still need the job token.
"""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest
from iterreduce.launch.yarn.skein_import import skein

from conftest_runtime import SOFTMAX, blobs, load_npz, records, simulate
from iterreduce.exceptions import JobFailed
from iterreduce.launch.yarn.container import app_credentials
from iterreduce.master import Master, MasterConfig
from iterreduce.proto import iterreduce_pb2 as pb
from iterreduce.proto import iterreduce_pb2_grpc as pb_grpc
from iterreduce.transport.security import (TlsCredentials, certificate_name, channel_credentials, channel_options,
                                           from_skein, metadata, new_token)
from iterreduce.worker import Worker
from shardio.shards import write_shards


@pytest.fixture(scope="module")
def creds() -> tuple[TlsCredentials, TlsCredentials]:
    """Two applications' credentials, A and B."""
    return from_skein(skein.Security.new_credentials()), from_skein(skein.Security.new_credentials())


def register(channel, token: str):
    """One Register call that fails within seconds if the connection is refused."""
    try:
        return pb_grpc.MasterStub(channel).Register(pb.RegisterRequest(worker_name="intruder"),
                                                    metadata=metadata(token), timeout=5, wait_for_ready=False)
    finally:
        channel.close()


def test_only_the_applications_certificate_and_token_get_through(creds, tmp_path):
    a, b = creds
    X, y = blobs(200, d=6, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 2)
    token = new_token()
    config = {"n_classes": 3, "epochs": 3}
    master = Master(MasterConfig(program=SOFTMAX, program_config=config, shards=uris, workers=1, token=token,
                                 output=str(tmp_path / "out"), heartbeat_interval=0.2, start_timeout=30.0))
    server, address = master.serve(tls=a)
    worker = Worker(address, token, "worker-0", tls=a)
    results = {}
    threads = [threading.Thread(target=lambda: results.setdefault("master", master.run()), daemon=True),
               threading.Thread(target=lambda: results.setdefault("worker", worker.run()), daemon=True)]
    try:
        threads[0].start()  # the master waits for its worker; meanwhile, others try to get in

        # (b) Plaintext, even with the right token: the master speaks only TLS.
        with pytest.raises(grpc.RpcError) as info:
            register(grpc.insecure_channel(address), token)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value

        # (c) Another application's credentials, with the right token: the client cannot verify
        # the master's certificate...
        with pytest.raises(grpc.RpcError) as info:
            register(grpc.secure_channel(address, channel_credentials(b), channel_options(b)), token)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        assert "CERTIFICATE_VERIFY_FAILED" in info.value.details()
        # ...and one that trusts the master's certificate is refused by the master for presenting
        # B's, or no certificate at all (require_client_auth).
        for key, chain in [(b.key, b.cert), (None, None)]:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(a.cert, key, chain),
                                          channel_options(a))
            with pytest.raises(grpc.RpcError) as info:
                register(channel, token)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value

        # The master's certificate names "skein-internal", not the host: without the override,
        # even credentials A fail the host name check.
        with pytest.raises(grpc.RpcError) as info:
            register(grpc.secure_channel(address, channel_credentials(a)), token)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        assert "Hostname Verification" in info.value.details()

        # (d) Credentials A but a wrong token: through TLS, stopped by the token check.
        with pytest.raises(grpc.RpcError) as info:
            register(grpc.secure_channel(address, channel_credentials(a), channel_options(a)), "wrong")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert info.value.details() == "missing or wrong job token"

        # (a) A worker with credentials A and the token runs the job to the end.
        threads[1].start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), "the job did not finish within 60 s"
    finally:
        server.stop(0)
        worker._stop.set()
        worker.channel.close()
        master._log.close()

    assert results == {"master": None, "worker": 0}
    assert master.members.names == ["worker-0"]  # none of the refused callers registered
    assert [r["step"] for r in records(tmp_path / "out")] == [0, 1, 2]
    result, expected = load_npz(tmp_path / "out" / "parameters.npz"), simulate(SOFTMAX, config, uris)
    for k in expected:
        assert np.array_equal(result[k], expected[k]), k  # TLS changes nothing in the numbers


def test_credentials_from_a_containers_files(creds, tmp_path):
    a, _ = creds
    (tmp_path / ".skein.crt").write_bytes(a.cert)
    (tmp_path / ".skein.pem").write_bytes(a.key)
    # What skein.ApplicationClient.from_current().security is in a container: the files' paths.
    security = skein.Security(cert_file=str(tmp_path / ".skein.crt"), key_file=str(tmp_path / ".skein.pem"))
    app = type("App", (), {"security": security})()
    assert app_credentials(app) == a
    assert certificate_name(a.cert) == "skein-internal"  # skein's certificates name no host
    assert "PRIVATE KEY" not in repr(a)  # the key never lands in a log line

    (tmp_path / ".skein.pem").unlink()
    with pytest.raises(JobFailed, match=r"TLS key file .*/\.skein\.pem is missing"):
        app_credentials(app)
