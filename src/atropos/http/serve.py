"""uvicorn, configured the one way every server we ship is served: with bounded request heads
(`heads.LimitedHttpToolsProtocol`: 431 past 64 KiB or 100 header fields), no access log, and no
`X-Forwarded-For`/`X-Forwarded-Proto` rewriting of the ASGI scope.

uvicorn's default (`proxy_headers=True`) wraps every app in a middleware that, for a peer on
127.0.0.1, replaces the scope's client address and scheme with what those headers say. Nothing
we serve reads either (the HTTP rules judge the Host and Origin headers, `atropos.http`), so the
layer only cost each request a coroutine and a scan of its headers, and would let any local
process make a request look as if it came from elsewhere to an app that did read them.

>>> config = uvicorn_config(object(), host="127.0.0.1", port=0)
>>> config.http.__name__, config.access_log, config.proxy_headers
('LimitedHttpToolsProtocol', False, False)
"""

from __future__ import annotations

from typing import Any

import uvicorn

from atropos.http.heads import LimitedHttpToolsProtocol

__all__ = ["uvicorn_config"]


def uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    """`uvicorn.Config(app, **options)` with our protocol and defaults (options override the
    defaults, never the protocol)."""
    settings: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": False,
        **options,
    }
    return uvicorn.Config(app, http=LimitedHttpToolsProtocol, **settings)
