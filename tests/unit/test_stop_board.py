"""Stop requests passed between llm instances over the server's board folder."""

from __future__ import annotations

import queue
import socket

from tritonllm.backend.stop_board import StopBoard, server_folder


def test_a_stop_told_reaches_every_other_instance_and_not_itself(tmp_path):
    heard: dict[str, queue.SimpleQueue] = {name: queue.SimpleQueue() for name in ("llm_0_0", "llm_0_1", "llm_0_2")}
    boards = [StopBoard(tmp_path, name, heard[name].put) for name in heard]
    try:
        assert boards[0].tell("request-7") == 2
        assert heard["llm_0_1"].get(timeout=5) == "request-7"
        assert heard["llm_0_2"].get(timeout=5) == "request-7"
        assert heard["llm_0_0"].empty()
        assert boards[1].tell("") == 0  # a stop needs an id
    finally:
        for board in boards:
            board.close()
    assert not list(tmp_path.glob("*.sock"))


def test_the_socket_of_a_dead_instance_is_removed_when_found(tmp_path):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(tmp_path / "llm_0_1.sock"))
    dead.close()  # its file stays, as a killed process leaves it
    board = StopBoard(tmp_path, "llm_0_0", lambda _: None)
    try:
        assert board.tell("request-1") == 0
        assert not (tmp_path / "llm_0_1.sock").exists()
    finally:
        board.close()


def test_each_server_and_model_has_a_folder_of_its_own():
    assert server_folder("llm", 100) != server_folder("llm", 101) != server_folder("other", 101)
