"""The one error a model's load raises for what the engine cannot serve exactly: never silently wrong output."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The engine cannot serve this model exactly; the message names what it lacks."""
