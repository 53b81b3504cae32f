"""`atropos sandbox image build NAME`: a local container image, never from a registry.

Two recipes (docs/sandbox.md, "Images"):

- `--debian`: a Debian root from the package mirrors (`mmdebstrap --variant=apt
  --include=python3,... SUITE - MIRROR | docker import - NAME`), e.g. a stand-in for a
  registry image a task names: `atropos sandbox image build python:3.11-slim --debian
  --include python3,python3-pip`.
- `CONTEXT` (a folder with a Dockerfile, or `-f FILE`): `docker build`, after checking that
  every image its FROM lines name is present locally (one clear error, never a pull).

The image is saved (`docker save`) under the cache dir (`--cache`, default
`$XDG_CACHE_HOME/atropos/images`); a later build of the same recipe, on this engine or a fresh
one, loads it from there in seconds. `--rebuild` builds anew. The engine is the docker
client's (`DOCKER_HOST`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from atropos.cli.argtypes import Parser
from atropos.images import (
    DEFAULT_MIRROR,
    DEFAULT_SUITE,
    DebianRoot,
    Dockerfile,
    ImageError,
    Recipe,
    cache_dir,
    ensure_image,
)

PROG = "atropos sandbox"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="sandboxes: the local images they run")
    nouns = p.add_subparsers(dest="noun", metavar="COMMAND", required=True)
    image_p = nouns.add_parser("image", help="local container images (no registry)")
    verbs = image_p.add_subparsers(dest="verb", metavar="VERB", required=True)
    build_p = verbs.add_parser(
        "build",
        help="build NAME from a Dockerfile or a Debian root, cached with docker save/load",
        description="Build image NAME from CONTEXT's Dockerfile (its FROM images must be"
        " present locally) or, with --debian, from a Debian root made by mmdebstrap from the"
        " package mirrors; save it under the cache dir and load it from there next time.",
    )
    build_p.add_argument("name", help="the image's name, e.g. atropos-sandbox or python:3.11-slim")
    build_p.add_argument("context", nargs="?", type=Path, help="a folder with a Dockerfile")
    build_p.add_argument("-f", "--file", type=Path, default=None, help="the Dockerfile")
    build_p.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    build_p.add_argument("--debian", action="store_true", help="a Debian root (mmdebstrap)")
    build_p.add_argument(
        "--suite", default=DEFAULT_SUITE, help=f"--debian's suite (default {DEFAULT_SUITE})"
    )
    build_p.add_argument(
        "--include",
        default="python3",
        metavar="PKG,PKG",
        help="--debian's packages beyond the apt variant (default python3)",
    )
    build_p.add_argument(
        "--mirror", default=DEFAULT_MIRROR, help=f"--debian's mirror (default {DEFAULT_MIRROR})"
    )
    build_p.add_argument(
        "--cache", type=Path, default=None, help=f"where images are saved (default {cache_dir()})"
    )
    build_p.add_argument("--rebuild", action="store_true", help="build even if present or saved")
    build_p.set_defaults(run=_build)
    return p


def _recipe(args: argparse.Namespace, p: argparse.ArgumentParser) -> Recipe:
    if args.debian:
        if args.context is not None or args.file is not None:
            p.error("--debian builds from the mirrors: give no CONTEXT or -f")
        packages = tuple(name for name in args.include.split(",") if name)
        return DebianRoot(suite=args.suite, include=packages, mirror=args.mirror)
    context = args.context or (args.file.parent if args.file is not None else None)
    if context is None:
        p.error("give CONTEXT (a folder with a Dockerfile), -f FILE, or --debian")
    recipe = Dockerfile(context, args.file, tuple(args.build_arg))
    if not recipe.path().is_file():
        p.error(f"no Dockerfile at {recipe.path()}")
    return recipe


def _build(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    recipe = _recipe(args, p)
    began = time.monotonic()
    try:
        how = ensure_image(args.name, recipe, cache=args.cache, rebuild=args.rebuild)
    except (ImageError, OSError, subprocess.TimeoutExpired) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: {how} in {time.monotonic() - began:.1f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    return int(args.run(args, p))
