"""The live dashboard: one self-contained page served at `GET /dashboard`.

The page (`dashboard.html`, package data next to this module) carries inline CSS and vanilla
JavaScript only: no CDN, no library, no data. It polls the API's own read-only endpoints
(`/stats`, `/stats/history`, `/rollouts`, `/info`) with the key it takes from the URL fragment
(`/dashboard#key=...`, never sent to the server) or from a form, kept in `sessionStorage`.
So the page itself needs no key, while every request for data does.

The response's Content-Security-Policy allows exactly the page's own inline script and style
(by hash), requests to the same origin, and nothing else: even text that slipped into the DOM
as markup could not run.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from atropos.http import body

PAGE = "dashboard.html"
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


def content_security_policy(html: str) -> str:
    """The CSP for `html`: its inline `<script>` and `<style>` blocks by SHA-256, same-origin
    requests, nothing else.

    >>> policy = content_security_policy("<style>b{}</style><script>1</script>")
    >>> policy.split("; ")[1]
    "script-src 'sha256-a4ayc/80/OGda4BO/1o/V0etpOqiLx1JwB5S3beHW0s='"
    >>> "style-src 'sha256-" in policy, "unsafe-inline" in policy
    (True, False)
    """
    found: dict[str, list[str]] = {"script": [], "style": []}
    for tag, text in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        found[tag].append(f"'sha256-{digest}'")
    return "; ".join(
        [
            "default-src 'none'",
            "script-src " + (" ".join(found["script"]) or "'none'"),
            "style-src " + (" ".join(found["style"]) or "'none'"),
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


@lru_cache(maxsize=1)
def page() -> tuple[bytes, dict[str, str]]:
    """The page's bytes and the security headers that go with them (read once)."""
    html = resources.files("atropos.api").joinpath(PAGE).read_text(encoding="utf-8")
    headers = {
        "content-security-policy": content_security_policy(html),
        "x-content-type-options": "nosniff",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
        "cache-control": "no-cache",
    }
    return html.encode(), headers


async def serve(request: Request) -> Response:
    """`GET /dashboard`: the page (open: it holds no data; its data requests carry the key)."""
    html, headers = page()
    response = await body.respond(request, html, 200, "text/html; charset=utf-8")
    response.headers.update(headers)
    return response
