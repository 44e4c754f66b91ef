"""The chat page at the shim's `/`: plain static files (chat_page/: HTML, CSS and JavaScript, no build step) that
call the OpenAI routes from the browser. They hold no secret, so they are served without the API key; the page
sends the key its user enters with every API call, which the routes check as any client's."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

PAGE = Path(__file__).parent / "chat_page"
PREFIX = "/chat"
ICON = "/favicon.ico"  # where browsers and tools look for a site's icon whatever the page links


def is_page(path: str) -> bool:
    """The page and its files: what RequireAPIKey lets through."""
    return path in ("/", ICON) or path.startswith(f"{PREFIX}/")


def install(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(PAGE / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get(ICON, include_in_schema=False)
    async def icon() -> FileResponse:
        return FileResponse(PAGE / "favicon.svg", media_type="image/svg+xml")

    app.mount(PREFIX, StaticFiles(directory=PAGE), name="chat")
