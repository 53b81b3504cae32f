"""The one set of HTTP rules every server we ship is built with: the trajectory API, `atropos
local serve`, the rollout proxy, the MCP fixture server and the fakes in `atropos.testing`.

- `origin`: Host names (DNS rebinding), Origin and Fetch-Metadata (cross-site pages), content
  types a page cannot send without a preflight.
- `rules`: `HttpRules`, the ASGI layer that applies them in front of every route, with the body
  limit and the last line of defence (input never gets a 5xx); `server_app` builds a Starlette
  app with it, `guard` puts it in front of any other ASGI app.
- `body`: bodies read within limits, gzip inflated within limits (bombs refused), responses.
- `decode`: JSON bodies decoded with every failure a 400 (too deep, not UTF-8, not JSON).
- `errors`: one error shape per dialect (the API's, OpenAI's, JSON-RPC's).
- `heads` and `serve`: request heads bounded in the HTTP parser; uvicorn configured with it.

A leaf: it imports only `atropos.wire` and `atropos.names`. tests/test_http_rules.py checks that
no module of the package builds a Starlette app or a uvicorn server but through here, and that
every server answers a hostile request the same way.
"""

from atropos.http.errors import ErrorShape, api_error, jsonrpc_error, openai_error
from atropos.http.origin import Site, refusal
from atropos.http.rules import BodyTooLarge, HttpRules, Rules, guard, rules_of, server_app

__all__ = [
    "BodyTooLarge",
    "ErrorShape",
    "HttpRules",
    "Rules",
    "Site",
    "api_error",
    "guard",
    "jsonrpc_error",
    "openai_error",
    "refusal",
    "rules_of",
    "server_app",
]
