"""The MCP server `mcp_tools` ships for its tasks: `python -m
atropos.environments.mcp_tools.fixture_server` (stdio), built with the `mcp` package's
`MCPServer`; `--http PORT` serves it over streamable HTTP instead, at
`http://127.0.0.1:PORT/mcp` (`--sse`: the legacy HTTP+SSE transport, at `/sse`), and
`--token T` makes it answer 401 to a request without `Authorization: Bearer T`.

Six deterministic tools over three small worlds: a unit converter (`convert_units`), a shop's
inventory (`lookup_item`, `items_in_category`) and a calendar (`add_days`, `weekday`,
`days_between`). A bad argument is a tool error whose text says what would be accepted, so a
policy can read it and try again. Two environment variables exist for tests:
`ATROPOS_MCP_FIXTURE_PIDFILE` (append this process's id to that file at start) and
`ATROPOS_MCP_FIXTURE_DELAY` (seconds every call waits before answering).

>>> convert_units(10, "km", "mi")
6.213712
>>> convert_units(100, "C", "F")
212.0
>>> add_days("2025-02-27", 2), weekday("2025-03-01"), days_between("2025-03-01", "2025-04-15")
('2025-03-01', 'Saturday', 45)
>>> lookup_item("sku-104")["name"]
'Trail Lamp'
"""

from __future__ import annotations

import argparse
import datetime
import hmac
import os
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "INVENTORY",
    "add_days",
    "convert_units",
    "days_between",
    "http_app",
    "items_in_category",
    "lookup_item",
    "main",
    "serve_http",
    "weekday",
]

# unit -> (dimension, factor to the dimension's base unit: metre, kilogram, litre)
_UNITS: dict[str, tuple[str, float]] = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "in": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "yd": ("length", 0.9144),
    "mi": ("length", 1609.344),
    "g": ("mass", 0.001),
    "kg": ("mass", 1.0),
    "lb": ("mass", 0.45359237),
    "oz": ("mass", 0.028349523125),
    "ml": ("volume", 0.001),
    "l": ("volume", 1.0),
    "gal": ("volume", 3.785411784),
}
_TEMPERATURES = ("C", "F", "K")

INVENTORY: tuple[dict[str, Any], ...] = (
    {"sku": "SKU-101", "name": "Camp Stove", "category": "camping", "price": 89.5,
     "stock": 14, "weight_kg": 2.4, "restock": "2025-03-14"},
    {"sku": "SKU-102", "name": "Dome Tent", "category": "camping", "price": 249.0,
     "stock": 6, "weight_kg": 3.8, "restock": "2025-04-02"},
    {"sku": "SKU-103", "name": "Sleeping Bag", "category": "camping", "price": 120.0,
     "stock": 0, "weight_kg": 1.6, "restock": "2025-02-20"},
    {"sku": "SKU-104", "name": "Trail Lamp", "category": "camping", "price": 34.25,
     "stock": 40, "weight_kg": 0.35, "restock": "2025-05-30"},
    {"sku": "SKU-201", "name": "Road Bike", "category": "cycling", "price": 1150.0,
     "stock": 3, "weight_kg": 9.2, "restock": "2025-06-10"},
    {"sku": "SKU-202", "name": "Bike Helmet", "category": "cycling", "price": 64.0,
     "stock": 25, "weight_kg": 0.3, "restock": "2025-03-01"},
    {"sku": "SKU-203", "name": "Tyre Pump", "category": "cycling", "price": 27.5,
     "stock": 12, "weight_kg": 0.45, "restock": "2025-01-31"},
    {"sku": "SKU-301", "name": "Kayak Paddle", "category": "water", "price": 145.0,
     "stock": 8, "weight_kg": 1.1, "restock": "2025-07-04"},
    {"sku": "SKU-302", "name": "Dry Bag", "category": "water", "price": 22.0,
     "stock": 60, "weight_kg": 0.2, "restock": "2025-02-14"},
)  # fmt: skip


class FixtureError(ValueError):
    """A bad argument; its message says what would be accepted."""


def convert_units(value: float, from_unit: str, to_unit: str) -> float:
    """Convert `value` between units of length (mm, cm, m, km, in, ft, yd, mi), mass (g, kg,
    lb, oz), volume (ml, l, gal) or temperature (C, F, K); rounded to 6 decimals."""
    if from_unit in _TEMPERATURES and to_unit in _TEMPERATURES:
        kelvin = {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[from_unit]
        out = {"C": kelvin - 273.15, "F": (kelvin - 273.15) * 9 / 5 + 32, "K": kelvin}[to_unit]
        return round(out, 6)
    known = ", ".join([*_UNITS, *_TEMPERATURES])
    for unit in (from_unit, to_unit):
        if unit not in _UNITS and unit not in _TEMPERATURES:
            raise FixtureError(f"unknown unit {unit!r}; known units: {known}")
    (dim_from, f_from), (dim_to, f_to) = (
        _UNITS.get(from_unit, ("temperature", 0)),
        _UNITS.get(to_unit, ("temperature", 0)),
    )
    if dim_from != dim_to:
        raise FixtureError(f"cannot convert {dim_from} ({from_unit}) to {dim_to} ({to_unit})")
    return round(value * f_from / f_to, 6)


def lookup_item(query: str) -> dict[str, Any]:
    """The inventory record of an item, by SKU (e.g. SKU-104) or by exact name (any case):
    sku, name, category, price (USD), stock (units), weight_kg, restock (next restock date)."""
    wanted = query.strip().lower()
    for item in INVENTORY:
        if wanted in (item["sku"].lower(), item["name"].lower()):
            return dict(item)
    names = ", ".join(f"{i['sku']} ({i['name']})" for i in INVENTORY)
    raise FixtureError(f"no item {query!r}; items: {names}")


def items_in_category(category: str) -> list[dict[str, str]]:
    """The SKU and name of every item in a category (camping, cycling or water)."""
    found = [
        {"sku": i["sku"], "name": i["name"]}
        for i in INVENTORY
        if i["category"] == category.strip().lower()
    ]
    if not found:
        categories = sorted({i["category"] for i in INVENTORY})
        raise FixtureError(f"no category {category!r}; categories: {', '.join(categories)}")
    return found


def _date(text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text.strip())
    except ValueError:
        raise FixtureError(f"{text!r} is not a date written YYYY-MM-DD") from None


def add_days(date: str, days: int) -> str:
    """The date `days` days after `date` (before it when negative), as YYYY-MM-DD."""
    return (_date(date) + datetime.timedelta(days=days)).isoformat()


def weekday(date: str) -> str:
    """The day of the week of a date (YYYY-MM-DD), e.g. Monday."""
    return _date(date).strftime("%A")


def days_between(start: str, end: str) -> int:
    """Days from `start` to `end` (both YYYY-MM-DD; negative when `end` is earlier)."""
    return (_date(end) - _date(start)).days


TOOLS = (convert_units, lookup_item, items_in_category, add_days, weekday, days_between)


def _served(fn: Any) -> Any:
    """`fn` as a tool: the delay applied, a `FixtureError` turned into the SDK's tool error."""
    import functools

    from mcp.server.mcpserver.exceptions import ToolError

    delay = float(os.environ.get("ATROPOS_MCP_FIXTURE_DELAY") or 0)

    @functools.wraps(fn)
    def tool(*args: Any, **kwargs: Any) -> Any:
        if delay:
            time.sleep(delay)
        try:
            return fn(*args, **kwargs)
        except FixtureError as err:
            raise ToolError(str(err)) from None

    return tool


def _server() -> Any:
    """The SDK's `MCPServer` with the six tools."""
    from mcp.server.mcpserver import MCPServer

    server: Any = MCPServer("atropos-fixture", log_level="WARNING")
    for fn in TOOLS:
        server.add_tool(_served(fn), structured_output=False)
    return server


class _RequireBearer:
    """ASGI middleware: an HTTP request without `Authorization: Bearer TOKEN` gets 401 (the
    lifespan and other scopes pass through)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                from starlette.responses import PlainTextResponse

                response = PlainTextResponse("a valid bearer token is required", 401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def serve_http(port: int, token: str | None = None, sse: bool = False) -> None:
    """Serve the tools over HTTP on 127.0.0.1:`port` until interrupted (module docstring)."""
    import uvicorn

    from atropos.http.serve import uvicorn_config

    uvicorn.Server(uvicorn_config(http_app(token, sse), host="127.0.0.1", port=port)).run()


def http_app(token: str | None = None, sse: bool = False) -> Any:
    """The ASGI app `serve_http` serves: the SDK's transport behind the HTTP rules of every
    server we ship (`atropos.http`, JSON-RPC errors), and the bearer check when `token`."""
    from atropos.http import Rules, guard, jsonrpc_error

    server = _server()
    app: Any = server.sse_app() if sse else server.streamable_http_app()
    if token:
        app = _RequireBearer(app, token)
    return guard(app, Rules.loopback(open_paths=(), dialect=lambda path: jsonrpc_error))


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the tools over stdio until stdin closes, or over HTTP with `--http PORT`."""
    parser = argparse.ArgumentParser(description="the mcp_tools fixture MCP server")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve over HTTP on this port")
    parser.add_argument("--token", help="with --http: the bearer token every request must carry")
    parser.add_argument("--sse", action="store_true", help="with --http: the legacy SSE transport")
    args = parser.parse_args(argv)
    if args.http is None and (args.token or args.sse):
        parser.error("--token and --sse need --http PORT")
    pidfile = os.environ.get("ATROPOS_MCP_FIXTURE_PIDFILE")
    if pidfile:
        with open(pidfile, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    if args.http is not None:
        serve_http(args.http, args.token, args.sse)
    else:
        _server().run()


if __name__ == "__main__":
    main()
