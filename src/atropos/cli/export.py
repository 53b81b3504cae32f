"""`atropos export sft|dpo`, and upstream's `atropos-sft-gen` and `atropos-dpo-gen`.

Both read groups from JSONL files (`--input`) or follow a running API read-only through
`GET /rollouts` (never `/register`, `/batch` or `/reset_data`: a live run is left exactly as it
was), and write chat-format JSONL (or upstream's lines with `--format upstream`, the default of
the compatibility commands). See docs/export.md.

>>> args = build_parser("sft", "atropos export sft").parse_args(["out.jsonl", "-i", "a.jsonl"])
>>> args.save_top_n_per_group, args.minimum_score_diff_max_min, args.format
(3, 0.0, 'chat')
>>> build_parser("dpo", "atropos-dpo-gen", compat=True).parse_args(["out.jsonl"]).format
'upstream'
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from atropos.cli.argtypes import Parser, non_negative_float, non_negative_int, positive_int
from atropos.export.run import ExportConfig, Kind, export
from atropos.export.source import ApiSource, FileSource, SourceError
from atropos.export.summary import Summary

DEFAULT_API_URL = "http://localhost:8000"
UPSTREAM_TOKENIZER = "NousResearch/DeepHermes-3-Llama-3-8B-Preview"
_WHAT = {
    "sft": "SFT examples (rejection sampling: the best sequences of each group)",
    "dpo": "DPO pairs (a better and a worse sequence of the same group)",
}


_DESCRIPTION = "SFT or DPO data from scored rollout groups (files, or a running API read-only)."


class _Usage(Exception):
    """A problem with the command line or the output path: exit status 2."""


def _add_arguments(p: argparse.ArgumentParser, kind: Kind, compat: bool) -> None:
    """The flags of one export command. Long because it is a table of flags."""
    p.add_argument("filepath", help="the JSONL file to write")
    src = p.add_argument_group("input (one of)")
    src.add_argument(
        "--input",
        "-i",
        nargs="+",
        metavar="FILE",
        help="JSONL files of `atropos env process` (one group per line; *.gz, - for stdin)",
    )
    src.add_argument(
        "--api-url",
        default=None,
        help=f"follow a running API through its read-only /rollouts (default {DEFAULT_API_URL})",
    )
    src.add_argument(
        "--api-key",
        default=os.environ.get("ATROPOS_API_KEY"),
        help="the API's bearer key (default $ATROPOS_API_KEY)",
    )
    src.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop following the API after this long (default: when enough lines are saved)",
    )
    src.add_argument(
        "--since-now",
        action="store_true",
        help="from the API, only groups arriving from now on (default: all it still holds)",
    )
    src.add_argument("--poll-interval", type=float, default=1.0, help=argparse.SUPPRESS)

    sel = p.add_argument_group("selection")
    if kind == "sft":
        sel.add_argument(
            "--save-top-n-per-group",
            type=positive_int,
            default=3,
            metavar="N",
            help="the most sequences saved per group, best first (default 3)",
        )
    else:
        sel.add_argument(
            "--save-n-pairs-per-group",
            type=positive_int,
            default=3,
            metavar="N",
            help="the most pairs made per group (default 3)",
        )
        sel.add_argument(
            "--seed", type=int, default=0, help="seed of the random rejected-side draw (0)"
        )
    sel.add_argument(
        "--num-seqs-to-save",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="stop after N lines; 0: no limit (default: 100 from an API, all from files)",
    )
    sel.add_argument(
        "--allow-negative-scores",
        action="store_true",
        help="keep scores <= 0 (as SFT examples, or as the chosen side of a pair)",
    )
    diff = 0.5 if kind == "dpo" else 0.0
    sel.add_argument(
        "--minimum-score-diff-max-min",
        type=non_negative_float,
        default=diff,
        metavar="X",
        help=(
            "keep only scores above the group's lowest + X (default 0.0)"
            if kind == "sft"
            else "a pair's chosen score must beat the rejected one by more than X (default 0.5)"
        ),
    )
    sel.add_argument(
        "--max-token-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="leave out sequences longer than N tokens (default: no limit)",
    )

    out = p.add_argument_group("output")
    out.add_argument(
        "--format",
        choices=["chat", "upstream"],
        default="upstream" if compat else "chat",
        help=(
            "chat: TRL-style conversational rows; upstream: atroposlib 0.4.0's lines"
            f" (default {'upstream' if compat else 'chat'})"
        ),
    )
    out.add_argument(
        "--save-messages",
        action="store_true",
        help="upstream format: conversations instead of decoded text (chat rows always are)",
    )
    out.add_argument(
        "--tokenizer",
        default=UPSTREAM_TOKENIZER if compat else None,
        help=(
            "decodes tokens of groups without messages, and upstream text lines ('tiny': the"
            " shipped test tokenizer)" + (f" (default {UPSTREAM_TOKENIZER})" if compat else "")
        ),
    )
    out.add_argument(
        "--append-to-previous",
        action="store_true",
        help="add to an existing file (without it, an existing file is an error)",
    )
    out.add_argument(
        "--summary-json", type=Path, default=None, metavar="PATH", help="also write the summary"
    )
    out.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    old = p.add_argument_group("accepted for compatibility, not used")
    old.add_argument(
        "--group-size", type=int, default=None, help="not needed: groups are read as they are"
    )
    old.add_argument(
        "--tasks-per-step", type=int, default=None, help="not needed: nothing registers"
    )


def build_parser(kind: Kind, prog: str, compat: bool = False) -> argparse.ArgumentParser:
    """The parser of one export command (`compat`: upstream's defaults for its scripts)."""
    p = Parser(
        prog=prog,
        description=f"Write {_WHAT[kind]} from scored rollout groups.",
        epilog="Reads an API only through GET /rollouts: nothing is consumed or reset.",
    )
    _add_arguments(p, kind, compat)
    return p


def _config(args: argparse.Namespace, kind: Kind, from_api: bool) -> ExportConfig:
    target = args.num_seqs_to_save
    if target is None:
        target = 100 if from_api else 0
    per_group = args.save_top_n_per_group if kind == "sft" else args.save_n_pairs_per_group
    return ExportConfig(
        kind=kind,
        format=args.format,
        save_messages=args.save_messages,
        per_group=per_group,
        target=target or None,
        allow_negative=args.allow_negative_scores,
        min_diff=args.minimum_score_diff_max_min,
        max_token_len=args.max_token_len,
        seed=getattr(args, "seed", 0),
    )


def _tokenizer(name: str | None) -> Callable[[], Any] | None:
    """A loader of `name`, called only when a group needs it (None: no tokenizer)."""
    if name is None:
        return None

    @functools.cache
    def load() -> Any:
        from atropos.inference.tokenizer import load_tokenizer

        try:
            return load_tokenizer(name)
        except ValueError as err:
            reason = str(err).split("; set ", 1)[0]
            raise SourceError(
                f"{reason}; pass --tokenizer with a local directory, a model id this machine"
                " can reach, or 'tiny'"
            ) from None

    return load


@contextlib.contextmanager
def _output(path: Path, append: bool) -> Iterator[IO[str]]:
    """The output file, opened to append or created; an existing file without `append` is a
    usage error (never overwritten). A file created here and left empty is removed."""
    existed = path.exists()
    if existed and not append:
        raise _Usage(f"{path} exists: pass --append-to-previous to add to it, or choose another")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "x", encoding="utf-8") as f:
        yield f
    if not existed and path.stat().st_size == 0:
        path.unlink()


def _progress(quiet: bool, total: float | None, unit: str) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = [TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()]
    bar = Progress(*columns, console=console, disable=quiet or not console.is_terminal)
    bar.add_task(f"0 {unit}", total=total)
    return bar


def run(argv: list[str], kind: Kind, prog: str, compat: bool = False) -> int:
    """Parse `argv`, export, print the summary; the exit status (see docs/export.md)."""
    args = build_parser(kind, prog, compat).parse_args(argv)
    try:
        return _run(args, kind, prog)
    except _Usage as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, kind: Kind, prog: str) -> int:
    if args.input and args.api_url:
        raise _Usage("give --input FILE ... or --api-url URL, not both")
    if Path(args.filepath).exists() and not args.append_to_previous:
        raise _Usage(f"{args.filepath} exists: pass --append-to-previous to add to it")
    for flag in ("group_size", "tasks_per_step"):
        if getattr(args, flag, None) is not None:
            note = f"--{flag.replace('_', '-')} is no longer needed (nothing registers); ignored"
            print(f"{prog}: note: {note}", file=sys.stderr)
    config = _config(args, kind, from_api=not args.input)
    tokenizer = _tokenizer(args.tokenizer)
    if config.needs_text:
        if tokenizer is None:
            raise _Usage("--format upstream text lines decode tokens: pass --tokenizer NAME")
        try:
            tokenizer()  # before anything is written: a wrong name fails now
        except SourceError as err:
            print(f"{prog}: error: {err}", file=sys.stderr)
            return 1
    source: FileSource | ApiSource
    try:
        if args.input:
            source = FileSource(args.input)
        else:
            source = ApiSource(
                args.api_url or DEFAULT_API_URL,
                args.api_key,
                timeout=args.timeout,
                poll_interval=args.poll_interval,
                since_now=args.since_now,
            )
    except SourceError as err:
        raise _Usage(str(err)) from None
    summary = Summary(kind, str(args.filepath), source.describe(), config.per_group, prog)
    status = _export(args, config, source, summary, tokenizer, prog)
    summary.notes.update(source.notes)
    if isinstance(source, ApiSource):
        source.close()
        if summary.stopped == "input exhausted":
            summary.stopped = "timeout"
    print(summary.text())
    if args.summary_json is not None:
        summary.write_json(args.summary_json)
    if status == 0 and summary.written == 0:
        return 1
    return status


def _export(
    args: argparse.Namespace,
    config: ExportConfig,
    source: FileSource | ApiSource,
    summary: Summary,
    tokenizer: Callable[[], Any] | None,
    prog: str,
) -> int:
    unit = "pairs" if config.kind == "dpo" else "lines"
    files = source if isinstance(source, FileSource) else None
    by_bytes = config.target is None and files is not None and files.total_bytes > 0
    total = config.target or (files.total_bytes if files is not None and by_bytes else None)
    bar = _progress(args.quiet, total, unit)

    def progress(s: Summary) -> None:
        done = files.done_bytes if files is not None and by_bytes else s.written
        text = f"{s.written} {unit} from {s.groups} groups"
        bar.update(bar.task_ids[0], completed=done, description=text)

    with bar, _output(Path(args.filepath), args.append_to_previous) as out:
        try:
            export(config, source, out, summary, tokenizer, progress)
        except KeyboardInterrupt:
            summary.stopped = "interrupted"
            return 130
        except SourceError as err:
            summary.stopped = f"error: {err}"
            print(f"{prog}: error: {err}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`atropos export sft|dpo ...` (what `atropos export` delegates to)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["sft"], ["dpo"]):
        kind: Kind = "sft" if argv[0] == "sft" else "dpo"
        return run(argv[1:], kind, f"atropos export {kind}")
    p = Parser(prog="atropos export", description=_DESCRIPTION)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in ("sft", "dpo"):
        verbs.add_parser(verb, help=_WHAT[verb], add_help=False)
    p.parse_args(argv)  # prints usage or help and exits
    return 2


def sft_gen() -> int:
    """`atropos-sft-gen FILEPATH [...]`: upstream's command, upstream's flags and defaults."""
    return run(sys.argv[1:], "sft", "atropos-sft-gen", compat=True)


def dpo_gen() -> int:
    """`atropos-dpo-gen FILEPATH [...]`: upstream's command, upstream's flags and defaults."""
    return run(sys.argv[1:], "dpo", "atropos-dpo-gen", compat=True)
