"""What the llm does when Triton stops it: the stop seen on tritonserver's command line and HTTP endpoint
(backend/unload_watch.py), and its multiplexed channels closed when their client has gone (backend/open_channels.py).
"""

from __future__ import annotations

import threading
import time

from tritonllm.backend.open_channels import OpenChannels
from tritonllm.backend.unload_watch import http_address, server_flags


def test_the_http_endpoint_is_read_from_tritonservers_command_line():
    launched = ["tritonserver", "--model-repository=/m", "--http-port=9100", "--http-address", "127.0.0.2"]
    assert http_address(server_flags(launched)) == ("127.0.0.2", 9100)
    assert http_address(server_flags(["tritonserver", "--model-repository", "/m"])) == ("127.0.0.1", 8000)
    assert http_address(server_flags(["tritonserver", "--http-address=[::]", "--http-port", "1"])) == ("::1", 1)
    assert http_address(server_flags(["tritonserver", "--allow-http=false"])) is None
    assert server_flags(["tritonserver", "--exit-timeout-secs=7"])["exit-timeout-secs"] == "7"


class Sender:
    """A channel's response sender as Triton 2.51 behaves: probing it once it is released (its FINAL sent) crashes
    the server, which this one records instead."""

    def __init__(self) -> None:
        self.cancelled = False
        self.released = False
        self.probed_after_release = False

    def is_cancelled(self) -> bool:
        self.probed_after_release |= self.released
        time.sleep(0.001)  # a round trip to the server, during which a close must not release it
        self.probed_after_release |= self.released
        return self.cancelled


class Responses:
    def __init__(self) -> None:
        self.ended: list[Sender] = []

    def end_channels(self, senders: list) -> None:
        for sender in senders:
            sender.released = True
        self.ended += senders


def test_a_channel_whose_client_has_gone_is_closed_by_the_sweep_and_no_other():
    responses = Responses()
    channels = OpenChannels(responses, sweep_interval_s=0.01)
    try:
        kept, gone = Sender(), Sender()
        channels.open("kept", kept)
        channels.open("gone", gone)
        gone.cancelled = True
        deadline = time.monotonic() + 10
        while not responses.ended and time.monotonic() < deadline:
            time.sleep(0.01)
        assert responses.ended == [gone]
        assert channels.live("gone") is None and channels.live("kept") is kept
        assert channels.close("kept") and not channels.close("kept")  # closed once
        assert responses.ended == [gone, kept]
    finally:
        channels.stop()


def test_a_channel_is_never_probed_once_closed():
    responses = Responses()
    channels = OpenChannels(responses, sweep_interval_s=0)
    try:
        senders = [Sender() for _ in range(200)]
        for i, sender in enumerate(senders):
            channels.open(str(i), sender)
        closing = threading.Thread(target=lambda: [channels.close(str(i)) for i in range(100)])
        closing.start()
        channels.close_all()
        closing.join()
        time.sleep(0.05)
        assert len(responses.ended) == 200 and not any(s.probed_after_release for s in senders)
    finally:
        channels.stop()
