"""The Batch API's files, jobs and each job's lines, in one SQLite database (the folder `--batch-dir` names), so
that a server stopped mid-batch goes on where it was at its next start: a line's answer is written when it comes,
in the same transaction that counts it, and a line without one is run again.

Every call is short and runs on the event loop's thread; each write commits before it returns (WAL journal),
so a kill -9 loses at most the lines whose answers had not come yet.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, created_at INTEGER NOT NULL,
    content BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, body TEXT NOT NULL  -- the batch object as the API answers it, as JSON
);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT, request TEXT,
    outcome TEXT,  -- the output or error file's line for it, as JSON; NULL: not answered yet
    failed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, line)
);
"""
DEFAULT_BATCH_DIR = Path.home() / ".cache" / "tritonllm" / "batches"
# statuses whose batch still has work: the runner takes them up again after a restart
LIVE = ("validating", "in_progress", "finalizing", "cancelling")


@dataclass(frozen=True)
class Line:
    number: int
    custom_id: str
    request: dict  # method, url, body


class BatchStore:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        # every write is a transaction of its own (`with self.db`), committed before the call returns
        self.db = sqlite3.connect(folder / "batches.sqlite3", check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # files

    def add_file(self, purpose: str, filename: str, content: bytes) -> dict:
        file_id, now = f"file-{uuid.uuid4().hex}", int(time.time())
        with self.db:
            self.db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?)", (file_id, purpose, filename, now, content))
        return self.file(file_id)

    def file(self, file_id: str) -> dict | None:
        row = self.db.execute(
            "SELECT id, purpose, filename, created_at, length(content) FROM files WHERE id = ?", (file_id,)
        ).fetchone()
        return None if row is None else _file_object(row)

    def files(self, purpose: str | None = None) -> list[dict]:
        rows = self.db.execute(
            "SELECT id, purpose, filename, created_at, length(content) FROM files "
            "WHERE ? IS NULL OR purpose = ? ORDER BY created_at DESC, rowid DESC",
            (purpose, purpose),
        ).fetchall()
        return [_file_object(row) for row in rows]

    def content(self, file_id: str) -> bytes | None:
        row = self.db.execute("SELECT content FROM files WHERE id = ?", (file_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def delete_file(self, file_id: str) -> bool:
        with self.db:
            return self.db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0

    # batches

    def add_batch(self, batch: dict) -> None:
        with self.db:
            self.db.execute("INSERT INTO batches VALUES (?, ?)", (batch["id"], json.dumps(batch)))

    def batch(self, batch_id: str) -> dict | None:
        row = self.db.execute("SELECT body FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    def batches(self) -> list[dict]:
        rows = self.db.execute("SELECT body FROM batches ORDER BY rowid DESC").fetchall()
        return [json.loads(row[0]) for row in rows]

    def live_batches(self) -> list[dict]:
        return [b for b in reversed(self.batches()) if b["status"] in LIVE]

    def update_batch(self, batch_id: str, **fields: Any) -> dict:
        """Sets fields of the batch object (a status with its `<status>_at` time) and answers it."""
        with self.db:
            batch = self.batch(batch_id)
            batch.update(fields)
            if "status" in fields and f"{fields['status']}_at" in batch:
                batch[f"{fields['status']}_at"] = int(time.time())
            self.db.execute("UPDATE batches SET body = ? WHERE id = ?", (json.dumps(batch), batch_id))
        return batch

    # a batch's lines

    def add_lines(self, batch_id: str, lines: list[Line], refused: list[tuple[int, str, dict]]) -> None:
        """The lines to run, and those refused as they were read (their error file entries), in one go."""
        with self.db:
            self.db.executemany(
                "INSERT OR IGNORE INTO lines VALUES (?, ?, ?, ?, NULL, 0)",
                [(batch_id, line.number, line.custom_id, json.dumps(line.request)) for line in lines],
            )
            self.db.executemany(
                "INSERT OR IGNORE INTO lines VALUES (?, ?, ?, NULL, ?, 1)",
                [(batch_id, number, custom_id, json.dumps(outcome)) for number, custom_id, outcome in refused],
            )
            self._count(batch_id)

    def unanswered(self, batch_id: str) -> list[Line]:
        rows = self.db.execute(
            "SELECT line, custom_id, request FROM lines WHERE batch_id = ? AND outcome IS NULL ORDER BY line",
            (batch_id,),
        ).fetchall()
        return [Line(number, custom_id, json.loads(request)) for number, custom_id, request in rows]

    def answer(self, batch_id: str, number: int, outcome: dict, failed: bool) -> None:
        """A line's answer, counted with it: written once, whatever a restart runs again."""
        with self.db:
            self.db.execute(
                "UPDATE lines SET outcome = ?, failed = ? WHERE batch_id = ? AND line = ? AND outcome IS NULL",
                (json.dumps(outcome), int(failed), batch_id, number),
            )
            self._count(batch_id)

    def outcomes(self, batch_id: str, failed: bool) -> list[dict]:
        rows = self.db.execute(
            "SELECT outcome FROM lines WHERE batch_id = ? AND outcome IS NOT NULL AND failed = ? ORDER BY line",
            (batch_id, int(failed)),
        ).fetchall()
        return [json.loads(row[0]) for row in rows]

    def _count(self, batch_id: str) -> None:
        total, done, failed = self.db.execute(
            "SELECT count(*), count(outcome), coalesce(sum(failed), 0) FROM lines WHERE batch_id = ?", (batch_id,)
        ).fetchone()
        batch = self.batch(batch_id)
        batch["request_counts"] = {"total": total, "completed": done - failed, "failed": failed}
        self.db.execute("UPDATE batches SET body = ? WHERE id = ?", (json.dumps(batch), batch_id))


def _file_object(row: tuple) -> dict:
    file_id, purpose, filename, created_at, size = row
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": created_at,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
