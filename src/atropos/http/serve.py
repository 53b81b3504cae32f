"""uvicorn, configured the one way every server we ship is served: with bounded request heads
(`heads.LimitedHttpToolsProtocol`: 431 past 64 KiB or 100 header fields) and no access log.

>>> config = uvicorn_config(object(), host="127.0.0.1", port=0)
>>> config.http.__name__, config.access_log
('LimitedHttpToolsProtocol', False)
"""

from __future__ import annotations

from typing import Any

import uvicorn

from atropos.http.heads import LimitedHttpToolsProtocol

__all__ = ["uvicorn_config"]


def uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    """`uvicorn.Config(app, **options)` with our protocol and defaults (options override the
    defaults, never the protocol)."""
    settings: dict[str, Any] = {"log_level": "warning", "access_log": False, **options}
    return uvicorn.Config(app, http=LimitedHttpToolsProtocol, **settings)
