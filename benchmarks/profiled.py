#!/usr/bin/env python3
"""Run a module or script under cProfile and write the profile when it ends, SIGTERM included.

`python -m cProfile` writes nothing for a server stopped by SIGTERM: uvicorn re-raises the
signal after its graceful shutdown, and the default action ends the process before cProfile
writes. Here SIGTERM raises SystemExit instead, so the profile is written.

Usage: `python benchmarks/profiled.py OUT.prof -m atropos api serve ...` or
`python benchmarks/profiled.py OUT.prof script.py ARGS...`.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: profiled.py OUT.prof (-m MODULE | SCRIPT) [ARGS...]")
    out, rest = sys.argv[1], sys.argv[2:]
    module = rest[0] == "-m"
    target = rest[1] if module else rest[0]
    sys.argv = [target, *rest[(2 if module else 1) :]]
    signal.signal(signal.SIGTERM, _exit)
    profile = cProfile.Profile()
    profile.enable()
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
