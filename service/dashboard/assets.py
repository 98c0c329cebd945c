"""plotly.js from the installed `plotly` Python package: the hosts that run this often have no internet.

The version is in the URL, so browsers may keep the file for a year; it is gzipped once in
memory (4.8 MB -> about 1.4 MB) for readers on a slow link.
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import plotly
from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
PLOTLY_URL = f"/vendor/plotly-{plotly.__version__}.min.js"
_CACHE = "public, max-age=31536000, immutable"


@lru_cache(maxsize=1)
def _plotly_bytes() -> tuple[bytes, bytes]:
    if not PLOTLY_JS.is_file():
        raise RuntimeError(
            f"{PLOTLY_JS} is missing: the installed plotly package has no bundled plotly.min.js; "
            "reinstall it with `pip install --force-reinstall plotly`"
        )
    raw = PLOTLY_JS.read_bytes()
    return raw, gzip.compress(raw, compresslevel=6)


@router.get(PLOTLY_URL)
def plotly_js(request: Request) -> Response:
    raw, packed = _plotly_bytes()
    headers = {"Cache-Control": _CACHE, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(packed, media_type="text/javascript", headers={**headers, "Content-Encoding": "gzip"})
    return Response(raw, media_type="text/javascript", headers=headers)
