"""OpenAI's Files and Batch APIs: `/v1/files` (upload a JSONL of requests, list, retrieve, download, delete) and
`/v1/batches` (create from a file with an endpoint and a completion window, list, retrieve with its request
counts, cancel). Kept in SQLite under `--batch-dir` (shim/batch_store.py) and run by shim/batch_runner.py."""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from tritonllm.shim.batch_runner import ENDPOINTS, BatchRunner
from tritonllm.shim.batch_store import BatchStore
from tritonllm.shim.errors import APIError, json_body

PURPOSES = ("batch", "batch_output", "fine-tune", "assistants", "vision", "user_data", "evals")
MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's bound on a batch's input file
WINDOW = re.compile(r"^(\d{1,4})h$")


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None  # the files stay until deleted


def build_router() -> APIRouter:
    router = APIRouter()

    def store(request: Request) -> BatchStore:
        return request.app.state.batch_store

    def runner(request: Request) -> BatchRunner:
        return request.app.state.batch_runner

    @router.post("/v1/files")
    async def upload(request: Request, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]) -> dict:
        if purpose not in PURPOSES:
            raise APIError(400, f"purpose must be one of {list(PURPOSES)}", "purpose")
        content = await file.read(MAX_FILE_BYTES + 1)
        if len(content) > MAX_FILE_BYTES:
            raise APIError(413, f"file: at most {MAX_FILE_BYTES // 2**20} MB", "file")
        return store(request).add_file(purpose, file.filename or "upload.jsonl", content)

    @router.get("/v1/files")
    async def files(request: Request, purpose: str | None = None) -> dict:
        return {"object": "list", "data": store(request).files(purpose), "has_more": False}

    @router.get("/v1/files/{file_id}")
    async def file(request: Request, file_id: str) -> dict:
        return _found(store(request).file(file_id), "file", file_id)

    @router.get("/v1/files/{file_id}/content")
    async def content(request: Request, file_id: str) -> Response:
        data = _found(store(request).content(file_id), "file", file_id)
        return Response(data, media_type="application/jsonl")

    @router.delete("/v1/files/{file_id}")
    async def delete(request: Request, file_id: str) -> dict:
        if not store(request).delete_file(file_id):
            _found(None, "file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @router.post("/v1/batches")
    async def create(request: Request, body: Annotated[BatchRequest, Depends(json_body(BatchRequest))]) -> dict:
        if body.endpoint not in ENDPOINTS:
            raise APIError(400, f"endpoint must be one of {list(ENDPOINTS)}", "endpoint")
        window = WINDOW.match(body.completion_window)
        if window is None or int(window.group(1)) < 1:
            raise APIError(400, "completion_window is a number of hours, as 24h", "completion_window")
        _found(store(request).file(body.input_file_id), "file", body.input_file_id, "input_file_id")
        now = int(time.time())
        batch = {
            "id": f"batch_{uuid.uuid4().hex}",
            "object": "batch",
            "endpoint": body.endpoint,
            "errors": None,
            "input_file_id": body.input_file_id,
            "completion_window": body.completion_window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + int(window.group(1)) * 3600,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.metadata,
        }
        store(request).add_batch(batch)
        runner(request).run(batch["id"])
        return batch

    @router.get("/v1/batches")
    async def batches(request: Request, limit: Annotated[int, Query(ge=1, le=100)] = 20, after: str | None = None):
        every = store(request).batches()
        start = next((i + 1 for i, b in enumerate(every) if b["id"] == after), 0) if after else 0
        page = every[start : start + limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(every),
        }

    @router.get("/v1/batches/{batch_id}")
    async def batch(request: Request, batch_id: str) -> dict:
        return _found(store(request).batch(batch_id), "batch", batch_id)

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel(request: Request, batch_id: str) -> dict:
        found = _found(store(request).batch(batch_id), "batch", batch_id)
        if found["status"] not in ("validating", "in_progress"):
            raise APIError(400, f"batch {batch_id} is {found['status']}: only a running batch is cancelled", "batch_id")
        return store(request).update_batch(batch_id, status="cancelling")

    return router


def _found(value, kind: str, name: str, param: str | None = None):
    if value is None:
        raise APIError(404, f"no {kind} {name!r}", param or f"{kind}_id")
    return value
