"""Runs the Batch API's jobs: each line a request to the shim's own route in this process (the same validation and
answers as a client's), a few at a time, as background work the llm admits after every interactive request
(BACKGROUND_PRIORITY). A job's progress lives in the store, so a restart takes every live job up where it was.

A job goes validating (its input file read into lines; a bad line is an error-file entry, not a failed job) ->
in_progress -> finalizing (the output and error files written) -> completed; cancelling -> cancelled keeps the
lines answered so far; past its completion window it is expired, with the same files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from tritonllm.shim.batch_store import BatchStore, Line

log = logging.getLogger(__name__)
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
CONCURRENT_LINES = 4  # in flight at once: the rest of the batch waits here, not in the engine's queue
BACKGROUND = "batch_line"  # the request state's mark of a batch line (shim/openai_api.py lowers its priority)


class BatchRunner:
    def __init__(self, store: BatchStore, app: ASGIApp, api_key: str | None) -> None:
        self.store = store
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        transport = httpx.ASGITransport(app=_marked_background(app))
        self.client = httpx.AsyncClient(transport=transport, base_url="http://batch", headers=headers, timeout=None)
        self.tasks: dict[str, asyncio.Task] = {}

    def resume(self) -> None:
        """Takes up every job a stop left live."""
        for batch in self.store.live_batches():
            log.info("batch %s: resumed (%s)", batch["id"], batch["status"])
            self.run(batch["id"])

    def run(self, batch_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._run(batch_id))
        self.tasks[batch_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(batch_id, None))

    async def close(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        await self.client.aclose()

    async def _run(self, batch_id: str) -> None:
        try:
            batch = self.store.batch(batch_id)
            if batch["status"] == "validating":
                batch = self._validate(batch)
            if batch["status"] == "in_progress":
                await self._lines(batch_id)
            self._finish(batch_id)
        except asyncio.CancelledError:
            raise  # the server stops: the job stays live for the next start
        except Exception:
            log.exception("batch %s failed", batch_id)
            errors = {"object": "list", "data": [{"code": "server_error", "message": "the server's log has its cause"}]}
            self.store.update_batch(batch_id, status="failed", errors=errors)

    def _validate(self, batch: dict) -> dict:
        content = self.store.content(batch["input_file_id"]) or b""
        lines, refused, seen = [], [], set()
        for number, text in enumerate(content.decode("utf-8", errors="replace").splitlines()):
            if not text.strip():
                continue
            line, error = _line(number, text, batch["endpoint"], seen)
            if error is None:
                lines.append(line)
            else:
                custom_id = line.custom_id if line else None
                outcome = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": None}
                refused.append((number, custom_id, {**outcome, "error": {"code": "invalid_request", "message": error}}))
        if not lines and not refused:
            errors = {"object": "list", "data": [{"code": "empty_file", "message": "the input file holds no requests"}]}
            return self.store.update_batch(batch["id"], status="failed", errors=errors)
        self.store.add_lines(batch["id"], lines, refused)
        if self.store.batch(batch["id"])["status"] == "cancelling":  # cancelled while it was read
            return self.store.batch(batch["id"])
        return self.store.update_batch(batch["id"], status="in_progress")

    async def _lines(self, batch_id: str) -> None:
        """Every line not answered yet, CONCURRENT_LINES at a time, until they are done or the job is cancelled or
        expires."""
        pending = self.store.unanswered(batch_id)
        running: set[asyncio.Task] = set()
        while pending or running:
            batch = self.store.batch(batch_id)
            stopping = batch["status"] != "in_progress" or time.time() > batch["expires_at"]
            while pending and not stopping and len(running) < CONCURRENT_LINES:
                running.add(asyncio.create_task(self._answer(batch_id, pending.pop(0))))
            if not running:
                return
            _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)

    async def _answer(self, batch_id: str, line: Line) -> None:
        request = line.request
        outcome: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id}
        try:
            response = await self.client.post(request["url"], json=request["body"])
        except Exception as e:  # the route itself answers every error; this is the call failing: the line's error
            log.exception("batch %s: line %d failed", batch_id, line.number)
            error = {"code": "server_error", "message": f"the request could not be made ({type(e).__name__})"}
            self.store.answer(batch_id, line.number, {**outcome, "response": None, "error": error}, failed=True)
            return
        try:
            body = response.json()
        except json.JSONDecodeError:
            body = {"error": {"message": response.text}}
        request_id = body.get("id") if isinstance(body, dict) else None
        outcome["response"] = {"status_code": response.status_code, "request_id": request_id, "body": body}
        outcome["error"] = None
        self.store.answer(batch_id, line.number, outcome, failed=response.status_code >= 400)

    def _finish(self, batch_id: str) -> None:
        batch = self.store.batch(batch_id)
        if batch["status"] not in ("in_progress", "finalizing", "cancelling"):
            return
        last = {"cancelling": "cancelled", "in_progress": "completed", "finalizing": "completed"}[batch["status"]]
        if last == "completed" and self.store.unanswered(batch_id):
            last = "expired"  # its window closed with lines unanswered
        if batch["status"] == "in_progress":
            batch = self.store.update_batch(batch_id, status="finalizing")
        files = {}
        for name, failed in (("output_file_id", False), ("error_file_id", True)):
            outcomes = self.store.outcomes(batch_id, failed)
            if outcomes:
                content = "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in outcomes).encode()
                kind = "error" if failed else "output"
                files[name] = self.store.add_file("batch_output", f"{batch_id}_{kind}.jsonl", content)["id"]
        self.store.update_batch(batch_id, status=last, **files)


def _line(number: int, text: str, endpoint: str, seen: set[str]) -> tuple[Line | None, str | None]:
    """One line of the input file as a request, or why it is refused."""
    try:
        item = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return None, f"line {number + 1} is not JSON: {e}"
    if not isinstance(item, dict):
        return None, f"line {number + 1} is not a JSON object"
    custom_id = item.get("custom_id")
    line = Line(number, custom_id if isinstance(custom_id, str) else None, item)
    if not isinstance(custom_id, str) or not custom_id:
        return line, f"line {number + 1}: custom_id must be a string"
    if custom_id in seen:
        return line, f"line {number + 1}: custom_id {custom_id!r} is not unique in the file"
    seen.add(custom_id)
    if item.get("method") != "POST":
        return line, f"line {number + 1}: method must be POST"
    if item.get("url") != endpoint:
        return line, f"line {number + 1}: url must be the batch's endpoint {endpoint}"
    body = item.get("body")
    if not isinstance(body, dict):
        return line, f"line {number + 1}: body must be an object"
    if body.get("stream"):
        return line, f"line {number + 1}: a batch answers whole; body.stream must be false"
    return Line(number, custom_id, {"url": endpoint, "body": body}), None


def _marked_background(app: ASGIApp) -> Callable:
    """The app, each request it is given marked as a batch line in its state."""

    async def marked(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, "state": {**scope.get("state", {}), BACKGROUND: True}}, receive, send)

    return marked
