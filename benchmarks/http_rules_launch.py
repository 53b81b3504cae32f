#!/usr/bin/env python3
"""Run a server module with the HTTP rules on (as shipped) or off, for
benchmarks/http_rules_cpu.py.

    python benchmarks/http_rules_launch.py on|off MODULE [ARGS...]

`off` replaces `atropos.http.rules.HttpRules.__call__` by a pass-through (`await
self.app(scope, receive, send)`) before `MODULE` is run as `python -m MODULE ARGS...` would run
it: the same app, built the same way, without the rules in front of its routes (no Host,
Origin or content-type checks, no body limit, no last line of defence). The first request it
passes through prints `http rules bypassed` to stderr once, so a log without that line means
the server has no `HttpRules` in its path at all. `on` runs the module unchanged.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any


def bypass() -> None:
    from atropos.http import rules

    told = False

    async def passthrough(self: Any, scope: Any, receive: Any, send: Any) -> None:
        nonlocal told
        if not told and scope["type"] == "http":
            told = True
            print("http rules bypassed", file=sys.stderr, flush=True)
        await self.app(scope, receive, send)

    rules.HttpRules.__call__ = passthrough  # type: ignore[method-assign]


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in ("on", "off"):
        raise SystemExit(__doc__)
    mode, module = sys.argv[1], sys.argv[2]
    if mode == "off":
        bypass()
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
