"""Readiness polls survive what a port gives before its server is up: a self-connect reads back its own request
as a malformed status line. Ports the tests and serve pick lie outside the ephemeral range, where no client
socket can be handed one as its source."""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest

from tritonllm.launcher.tritonserver import ServerError, TritonServer, ephemeral_ports, free_port, free_ports


def test_a_real_self_connect_reads_back_its_own_request():
    """What the kernel does when a client's source port is the closed port it connects to."""
    port = next(p for p in ephemeral_ports() if _bindable(p))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.connect(("127.0.0.1", port))  # nothing listens, yet it connects: to itself
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\n\r\n")
        assert s.recv(100).startswith(b"GET /v2/health/ready")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SelfConnectThenReady:
    """A port that answers its first connections as a self-connect does (the request echoed back), then as a
    ready server."""

    def __init__(self, echoes: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.listener.getsockname()[1]
        self.echoes = echoes
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            connection, _ = self.listener.accept()
            with connection:
                request = connection.recv(4096)
                if self.echoes > 0:
                    self.echoes -= 1
                    connection.sendall(request)
                else:
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def test_the_poll_waits_through_a_self_connect_until_the_server_is_ready(tmp_path):
    port = SelfConnectThenReady(echoes=3)
    server = TritonServer(tmp_path, http_port=port.port)
    started = time.monotonic()
    server.wait_ready(timeout=30)
    assert port.echoes == 0 and time.monotonic() - started < 30


def test_a_poll_that_only_ever_self_connects_ends_at_its_timeout(tmp_path):
    port = SelfConnectThenReady(echoes=10**6)
    with pytest.raises(ServerError, match="not ready after"):
        TritonServer(tmp_path, http_port=port.port).wait_ready(timeout=1)


def test_picked_ports_lie_outside_the_ephemeral_range():
    ephemeral = ephemeral_ports()
    assert all(free_port() not in ephemeral for _ in range(50))


def test_free_ports_are_different_ports_even_where_each_pick_would_be_the_same(monkeypatch):
    """A server's listeners need a port each: picked one by one at random, two once came out the same, and the
    shim's bind failed after tritonserver had taken it (tests/e2e's serve, on a CI machine)."""
    monkeypatch.setattr(random, "sample", lambda population, k: sorted(population)[:k])  # every pick the same
    assert free_port() == free_port()
    ports = free_ports(4)
    assert len(set(ports)) == 4 and not set(ports) & set(ephemeral_ports())


def test_serve_refuses_one_port_for_two_listeners(tiny_model_dir, capfd):
    from tritonllm.launcher import cli

    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    argv = ["serve", "--model-dir", str(tiny_model_dir), *ports, "--shim-port", str(http)]
    assert cli.main(argv) == 2
    assert f"port {http} is given to both --http-port and --shim-port" in capfd.readouterr().err


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port", "--metrics-port", "--shim-port"])
def test_serve_names_a_port_in_use_before_starting_anything(tiny_model_dir, flag, capfd):
    from tritonllm.launcher import cli

    with socket.create_server(("127.0.0.1", free_port())) as taken:
        flags = ("--http-port", "--grpc-port", "--metrics-port", "--shim-port")
        ports = {f: str(port) for f, port in zip(flags, free_ports(len(flags)), strict=True)}
        ports[flag] = str(taken.getsockname()[1])
        argv = ["serve", "--model-dir", str(tiny_model_dir), *(x for pair in ports.items() for x in pair)]
        assert cli.main(argv) == 2
    assert f"({flag}) is in use" in capfd.readouterr().err
