"""`/docs` (Swagger UI) and `/redoc` from the installed `fastapi-offline` package's files.

FastAPI's own pages load both from a CDN, which an offline GPU host cannot reach, and start
Swagger UI with an inline script, which the pages' Content-Security-Policy forbids; these
pages load the package's copies from `/docs-assets/` and start Swagger UI from
`/static/swagger-init.js`. ReDoc starts itself from its `<redoc spec-url>` element; its menu's
"API docs by Redocly" logo is the one file it would fetch from elsewhere, so the bundle is
served with that URL replaced by an empty image (the menu hides a logo that does not load).
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"
REDOC_LOGO = b'src:"https://cdn.redoc.ly/redoc/logo-mini.svg"'

router = APIRouter(include_in_schema=False)


def assets_dir() -> Path:
    """The package's folder of swagger-ui-bundle.js, swagger-ui.css and redoc.standalone.js."""
    folder = Path(str(files("fastapi_offline") / "static"))
    if not (folder / "swagger-ui-bundle.js").is_file():
        raise RuntimeError(
            f"{folder} has no swagger-ui-bundle.js: reinstall the package "
            "(`pip install -c constraints.txt --force-reinstall fastapi-offline`)"
        )
    return folder


def _page(title: str, head: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvcanary API · {title}</title>
<link rel="icon" href="{ASSETS_URL}/favicon.png">
{head}
</head>
<body>
{body}
</body>
</html>
"""
    )


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return _page(
        "Swagger UI",
        f'<link rel="stylesheet" href="{ASSETS_URL}/swagger-ui.css">',
        f'<div id="swagger-ui" data-openapi-url="/openapi.json"></div>\n'
        f'<script src="{ASSETS_URL}/swagger-ui-bundle.js"></script>\n'
        '<script src="/static/swagger-init.js"></script>',
    )


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return _page(
        "ReDoc",
        "",
        f'<redoc spec-url="/openapi.json"></redoc>\n<script src="{ASSETS_URL}/redoc.standalone.js"></script>',
    )


@lru_cache(maxsize=1)
def _redoc_bundle() -> bytes:
    bundle = (assets_dir() / "redoc.standalone.js").read_bytes()
    if REDOC_LOGO not in bundle:
        raise RuntimeError(
            f"redoc.standalone.js no longer holds {REDOC_LOGO.decode()}: check what the new ReDoc "
            "loads from elsewhere and update service/api/docs.py"
        )
    return bundle.replace(REDOC_LOGO, b'src:"data:,"')


@router.get(f"{ASSETS_URL}/redoc.standalone.js")
def redoc_bundle() -> Response:
    return Response(_redoc_bundle(), media_type="text/javascript")


def install(app: FastAPI) -> None:
    """Add both pages and their files; the app must be made with `docs_url=None, redoc_url=None`."""
    app.include_router(router)
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")
