"""`atropos view` and `view-run`: one self-contained HTML page of rollouts.

`atropos view FILE.jsonl [FILE2 ...] [-o OUT.html] [--tokenizer NAME] [--limit N]` writes the
page of JSONL files of groups (what `atropos env process` writes); `atropos view --api-url
URL` and `view-run` read the recent groups of a running API instead, through its read-only
`/rollouts`. `--watch SECONDS` rewrites the page every SECONDS until interrupted. See
docs/view.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atropos.cli.argtypes import Parser, positive_int, positive_seconds
from atropos.view import DEFAULT_LIMIT, build_page, page_of_files, write_text
from atropos.view.live import ApiError, Follower

DEFAULT_API = "http://localhost:8000"
VIEW_RUN_OUT = "runs/view-run.html"
_sleep = time.sleep  # (tests replace it)


def _add_common(p: argparse.ArgumentParser, out_help: str) -> None:
    p.add_argument("-o", "--out", type=Path, default=None, help=out_help)
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer (hub id, local directory, or `tiny`): highlights the trained tokens",
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help=f"groups on the page at most (default {DEFAULT_LIMIT})",
    )
    p.add_argument("--title", default=None, help="the page's title")
    p.add_argument(
        "--watch",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="rewrite the page every SECONDS until interrupted",
    )


def _add_api(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument(
        "--api-url",
        default=default,
        help="read recent groups from this API's GET /rollouts"
        + (f" (default {default})" if default else " instead of files"),
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("ATROPOS_API_KEY"),
        help="the API's bearer key (default: $ATROPOS_API_KEY)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="atropos view",
        description="Write one self-contained HTML page of rollout groups: scores, messages,"
        " trained tokens, search, filters and sorting (no network needed to open it).",
    )
    p.add_argument("files", nargs="*", type=Path, metavar="FILE", help="JSONL files of groups")
    _add_common(p, "the page (default: beside the first FILE, as .html)")
    _add_api(p, None)
    return p


def build_view_run_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="view-run",
        description="Write an HTML page of the recent groups of a running Atropos API (read"
        " through GET /rollouts: nothing is consumed or reset).",
    )
    _add_common(p, f"the page (default {VIEW_RUN_OUT})")
    _add_api(p, DEFAULT_API)
    ignored = "accepted for compatibility with atroposlib; ignored"
    p.add_argument("--port", type=int, default=None, help=f"{ignored} (no server: a file)")
    p.add_argument("--group-size", type=int, default=None, help=ignored)
    p.add_argument("--max-token-len", type=int, default=None, help=ignored)
    return p


def _default_out(first: Path) -> Path:
    name = first.name
    for suffix in (".gz", ".jsonl", ".json", ".jsonlines"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return first.with_name(name + ".html")


def _recorded(jsonl: Path, prog: str) -> tuple[str | None, Any]:
    """The tokenizer the run that wrote `jsonl` recorded, loaded (None, None without one; a
    note and no highlighting when it does not load here, e.g. a hub id offline)."""
    from atropos.view.read import recorded_tokenizer

    name = recorded_tokenizer(jsonl)
    if name is None:
        return None, None
    try:
        return name, _load_tokenizer(name)
    except (ValueError, OSError) as err:
        print(f"{prog}: note: the run's tokenizer {name!r} does not load here ({err})")
        return None, None


def _load_tokenizer(name: str | None) -> Any:
    if name is None:
        return None
    from atropos.inference.tokenizer import load_tokenizer

    return load_tokenizer(name)


def _loop(write: Callable[[], str], watch: float | None, prog: str) -> int:
    """Write once, or every `watch` seconds until interrupted; print each summary."""
    try:
        while True:
            print(write(), flush=True)
            if watch is None:
                return 0
            _sleep(watch)
    except KeyboardInterrupt:
        return 0
    except ApiError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, prog: str, default_out: Path | None) -> int:
    files: list[Path] = list(getattr(args, "files", []) or [])
    if files and args.api_url:
        print(f"{prog}: error: give FILEs or --api-url, not both", file=sys.stderr)
        return 2
    if not files and not args.api_url:
        print(f"{prog}: error: give one or more JSONL FILEs (or --api-url)", file=sys.stderr)
        return 2
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"{prog}: error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        tokenizer = _load_tokenizer(args.tokenizer)
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    if tokenizer is None and files:  # the tokenizer the run recorded, when it loads here
        args.tokenizer, tokenizer = _recorded(files[0], prog)
    limit = args.limit or DEFAULT_LIMIT
    out = args.out or default_out or _default_out(files[0])

    if files:
        title = args.title or ", ".join(f.name for f in files)

        def write() -> str:
            text, found = page_of_files(files, title, tokenizer, args.tokenizer, limit)
            write_text(out, text)
            return _summary(out, len(found.entries), found.bad, found.unread)

        return _loop(write, args.watch, prog)

    follower = Follower(args.api_url, limit, api_key=args.api_key)
    title = args.title or f"rollouts of {follower.url}"

    def write_live() -> str:
        follower.poll()
        found = follower.collection()
        write_text(out, build_page(found, title, tokenizer, args.tokenizer))
        return _summary(out, len(found.entries), found.bad, 0)

    return _loop(write_live, args.watch, prog)


def _summary(out: Path, groups: int, bad: int, unread: int) -> str:
    """`out (3 groups, 1 bad line skipped)`."""
    parts = [_plural(groups, "group")]
    if bad:
        parts.append(f"{_plural(bad, 'bad line')} skipped")
    if unread:
        parts.append(f"{unread} more not read (--limit)")
    return f"{out} ({', '.join(parts)})"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def main(argv: list[str] | None = None) -> int:
    """`atropos view ...`."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return _run(args, "atropos view", None)


def view_run(argv: list[str] | None = None) -> int:
    """`view-run ...` (atroposlib's name): the page of a running API's recent groups.

    Upstream served an interactive Gradio page with a public share link and took its groups
    by resetting the API and consuming batches; this reads `/rollouts` and writes a file.
    """
    args = build_view_run_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.port is not None:
        print(
            "view-run: --port is ignored: the page is a file (open it in a browser);"
            " see --watch to keep it fresh",
            file=sys.stderr,
        )
    return _run(args, "view-run", args.out or Path(VIEW_RUN_OUT))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
