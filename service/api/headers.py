"""Security headers on every response: what a browser may load, frame or send along.

The dashboard's pages run only the service's own scripts (`/static/*.js`, plotly.js from
`/vendor/`) and stylesheets (`/static/dashboard.css`), with no inline script or handler, so
scripts are `'self'` only. plotly.js writes styles of its own into the page as it draws (a
`<style>` element with content, style attributes), so styles are allowed inline: they cannot
run code, and no script can be injected.

Swagger UI and ReDoc (`/docs`, `/redoc`) load their files from this service too, but set inline
styles as they render (ReDoc builds its stylesheet at run time and searches in a worker made
from a blob), so their pages also allow inline styles and blob workers; never inline scripts.
No page may be framed (clickjacking), no response is sniffed as another type, and no URL
(which can carry run ids and labels) leaves as a referrer.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
DOCS_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "worker-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
DOCS_PAGES = frozenset({"/docs", "/redoc"})
_COMMON = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """Pure ASGI (no per-request task or body copy): adds the headers as the response starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = (DOCS_POLICY if scope["path"] in DOCS_PAGES else PAGE_POLICY).encode()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in (*_COMMON, (b"content-security-policy", policy)):
                    if name not in present:
                        headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
