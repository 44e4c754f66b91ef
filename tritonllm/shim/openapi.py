"""/openapi.json with the real request bodies: the routes parse their JSON bodies themselves (whatever the
Content-Type, see errors.json_body), so FastAPI cannot see them; each body's pydantic model is added here."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi


def document_bodies(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for route in _routes(app.routes):
            dependencies = getattr(getattr(route, "dependant", None), "dependencies", [])
            model = next((d.call.body_model for d in dependencies if hasattr(d.call, "body_model")), None)
            if model is None:
                continue
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            reference = {"$ref": f"#/components/schemas/{model.__name__}"}
            for method in route.methods:
                schema["paths"][route.path_format][method.lower()]["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": reference}},
                }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def _routes(routes: list) -> list:
    """The routes themselves, also those of included routers (FastAPI keeps those behind a wrapper)."""
    flat = []
    for route in routes:
        included = getattr(route, "original_router", None)
        flat += _routes(included.routes) if included is not None else [route]
    return flat
