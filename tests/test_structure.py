"""The direction of imports inside `src/atropos` (docs: DESIGN.md, "Direction of imports").

Every module is parsed with `ast`; every `import` counts, at module level and inside functions
alike (a deferred import is still a dependency: it only moves the failure to run time). Imports
under `if TYPE_CHECKING:` do not count: they never run.

Three rules:

- **Layers.** `LAYERS` below says, for each part of the package, which other parts it may
  import. The design's rule reads `wire` < `rewards`, `inference` < `envs` < `environments` <
  `cli`; `api` uses only `wire`; the trainer never imports the runtime (`envs`,
  `environments`) or the API. Every other part is placed in that order too.
- **No loops.** The modules form no cycle, counting every import that runs (module level and
  deferred), except the edges in `DEFERRED_BACK_EDGES`; module-level imports alone form no
  cycle with no exception at all. Each cycle found is reported by its modules.
- **testing/ is for tests.** Nothing outside `atropos.testing` imports it, except the entries
  of `TESTING_USERS`.

`python tests/test_structure.py [SRC]` prints the cycles and layer breaks of a tree (used to
measure a branch against main).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ----- the table ----------------------------------------------------------------------------
# The part of a module is its first name below `atropos` (`atropos.envs.runner.serve` -> envs),
# with six leaves named on their own: `wire` (the protocol), `net` (free ports), `names`
# (the one "did you mean" hint and the one loopback check), `engines` (how vLLM is started),
# `install` (the one install hint: the pip command that fits how atropos was installed) and
# `tiny-data` (`atropos.tiny` itself, which only names the shipped tokenizer and policy files;
# `atropos.tiny.model` and `.warmstart` are the part `tiny`). `root` is `atropos/__init__.py`
# (the version and nothing else).
LEAVES = frozenset({"wire", "net", "names", "tiny-data", "root", "engines", "install", "images"})
"""Parts anyone may import: they import nothing of ours."""

LAYERS: dict[str, frozenset[str]] = {
    # leaves
    "root": frozenset(),
    "wire": frozenset(),
    "net": frozenset(),
    "names": frozenset(),
    "install": frozenset(),  # the install hint every missing extra prints
    "engines": frozenset(),  # how vLLM is started (the demo, launch and the tests share it)
    "tiny-data": frozenset(),
    "images": frozenset(),  # local container images, never pulled (sandboxes, tests, the CLI)
    # the first floor: reward functions, inference clients, metrics sinks, the rollout viewer
    "rewards": frozenset(),
    "inference": frozenset(),
    "metrics": frozenset(),
    "view": frozenset(),
    # the HTTP rules every server is built with (uses only leaves)
    "http": frozenset(),
    # one Sandbox API over local providers, pools and the sweep (uses only leaves)
    "sandbox": frozenset(),
    # servers that speak only the protocol
    "api": frozenset({"http"}),  # api uses only wire and the HTTP rules
    "local": frozenset({"inference", "http"}),  # inference: the CPU server uses its tokenizers
    # the env runtime, then the environments built on it
    "envs": frozenset({"rewards", "inference", "metrics", "view"}),
    # the rollout proxy (inference behind OpenAI/Anthropic APIs) and its agent environment base
    "proxy": frozenset({"http", "envs", "inference", "metrics", "rewards"}),
    # agent programs (harnesses) in sandboxes against the proxy, and their environment
    "harnesses": frozenset({"envs", "proxy", "inference", "sandbox"}),
    "environments": frozenset(
        {"envs", "proxy", "rewards", "inference", "metrics", "http", "sandbox", "harnesses"}
    ),
    # the public trainer client: the API's calls, batches as tensors, weights into the servers
    # (rewards: GRPO's advantage; local: the process group a weight transfer joins, deferred)
    "client": frozenset({"rewards", "local"}),
    # the trainer: never the runtime (envs, environments), never the API; built on the client
    "trainer": frozenset({"client", "inference", "local", "metrics", "rewards", "tiny"}),
    # third-party trainers on Atropos batches (TRL first): the client, and nothing else of ours
    "integrations": frozenset({"client", "rewards"}),
    # other frameworks' environment protocols (ORS, OpenEnv), both ways: over the runtime
    "interop": frozenset(
        {"envs", "environments", "inference", "http", "rewards", "metrics", "proxy"}
    ),
    # the tiny policy's builder and warm start (trained on an environment's items)
    "tiny": frozenset({"inference", "environments"}),
    # fakes shipped for tests
    "testing": frozenset(
        {"inference", "local", "api", "envs", "environments", "proxy", "tiny", "http"}
    ),
    # export and launch read files and start processes through the CLIs
    "export": frozenset({"view", "metrics"}),
    "launch": frozenset(),
    "demo": frozenset({"tiny", "inference", "local"}),
    # the top: the command line may import every part but testing
    "cli": frozenset(
        {
            "api",
            "client",
            "demo",
            "environments",
            "envs",
            "export",
            "http",
            "inference",
            "interop",
            "launch",
            "local",
            "metrics",
            "proxy",
            "rewards",
            "tiny",
            "trainer",
            "view",
        }
    ),
    "__main__": frozenset({"cli"}),
}
"""For each part, the parts it may import besides itself and the leaves."""

MODULE_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("atropos.trainer.__main__", "atropos.cli.train"): (
        "`python -m atropos.trainer` is what torchrun starts on each process (`torchrun -m"
        " atropos.trainer`); it runs the same command line as `atropos train`, and nothing"
        " imports it"
    ),
    ("atropos.local.server", "atropos.cli.listen"): (
        "listen.py binds the listening socket of both servers (stdlib only); it stays in cli/"
        " until the loopback helpers are consolidated in one shared place"
    ),
}
"""Single module-to-module imports that cross the table, each with its reason."""

TESTING_USERS: dict[str, str] = {
    "atropos.envs.runner": (
        "`--testing` (upstream's flag) runs the env against the fake inference server"
        " in-process: it imports `atropos.testing.fake_server` only in that branch, so the"
        " production path is the same code with a real server"
    ),
}
"""Modules outside `atropos.testing` that may import it, and why (tests may, always)."""

DEFERRED_BACK_EDGES: dict[tuple[str, str], str] = {
    ("atropos.envs.base", "atropos.envs.cli"): (
        "`BaseEnv.cli()` is upstream's entry point (`MyEnv.cli()` in an env's `__main__`); the"
        " CLI drives the env class it is given, so the call goes up to the CLI and is deferred"
        " to the moment it is made: authoring or importing an env never loads the CLI"
    ),
}
"""Deferred imports that go back up a layer (so they close a cycle), each with its reason."""


# ----- reading the tree ---------------------------------------------------------------------


def modules(src: Path) -> dict[str, tuple[Path, bool]]:
    """Every module under `src/atropos`: dotted name -> (file, is a package)."""
    found = {}
    for path in sorted((src / "atropos").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, package)
    return found


def _targets(
    name: str, package: bool, node: ast.Import | ast.ImportFrom, known: set[str]
) -> list[str]:
    """Our modules an import statement loads (a `from pkg import sub` names `pkg.sub`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:  # relative: from the module's package, up level - 1
        base = name.split(".") if package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.append(sub if sub in known else source)
    return [t for t in out if t in known]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(src: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level imports, every import that runs) of each module, as module names."""
    found = modules(src)
    known = set(found)
    top: dict[str, set[str]] = defaultdict(set)
    every: dict[str, set[str]] = defaultdict(set)
    for name, (path, package) in found.items():

        def walk(node: ast.AST, at_top: bool, name: str = name, package: bool = package) -> None:
            for child in ast.iter_child_nodes(node):
                if _is_type_checking(child):
                    continue
                if isinstance(child, ast.Import | ast.ImportFrom):
                    for target in _targets(name, package, child, known):
                        if target != name:
                            every[name].add(target)
                            if at_top:
                                top[name].add(target)
                deferred = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                walk(child, at_top and not deferred)

        walk(ast.parse(path.read_text(), str(path)), True)
    return top, every


def part(module: str) -> str:
    """The part of the package a module belongs to (see the table)."""
    names = module.split(".")
    if len(names) == 1:
        return "root"
    if module == "atropos.tiny":
        return "tiny-data"
    return names[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer_breaks(every: dict[str, set[str]]) -> list[str]:
    """Each import that crosses the table, as 'importer -> imported (parts)'."""
    breaks = []
    for importer, targets in sorted(every.items()):
        mine = part(importer)
        allowed = LAYERS[mine] | LEAVES | {mine}
        for target in sorted(targets):
            theirs = part(target)
            if theirs == "testing" or theirs in allowed:
                continue
            if (importer, target) not in MODULE_EXCEPTIONS:
                breaks.append(f"{importer} -> {target} ({mine} may not import {theirs})")
    return breaks


def library_imports_of_testing(every: dict[str, set[str]]) -> list[str]:
    """Each import of `atropos.testing` from outside it that `TESTING_USERS` does not name."""
    return [
        f"{importer} -> {target}"
        for importer, targets in sorted(every.items())
        for target in sorted(targets)
        if part(target) == "testing"
        and part(importer) != "testing"
        and importer not in TESTING_USERS
    ]


def _without(graph: dict[str, set[str]], edges: dict[tuple[str, str], str]) -> dict[str, set[str]]:
    return {a: {b for b in targets if (a, b) not in edges} for a, targets in graph.items()}


# ----- the tests ----------------------------------------------------------------------------

SRC = ROOT / "src"
TOP, EVERY = imports(SRC)


def test_every_part_is_in_the_table():
    parts = {part(m) for m in modules(SRC)}
    assert parts <= set(LAYERS), f"parts missing from LAYERS: {sorted(parts - set(LAYERS))}"


def test_module_level_imports_form_no_cycle():
    found = cycles(TOP)
    assert not found, "import cycles at module level:\n" + "\n".join(map(" <-> ".join, found))


def test_imports_form_no_cycle_counting_deferred_ones():
    found = cycles(_without(EVERY, DEFERRED_BACK_EDGES))
    assert not found, "import cycles (deferred imports counted):\n" + "\n".join(
        map(" <-> ".join, found)
    )


def test_imports_follow_the_layers():
    breaks = layer_breaks(EVERY)
    assert not breaks, "imports against the direction in LAYERS:\n" + "\n".join(breaks)


def test_only_tests_and_fakes_import_testing():
    users = library_imports_of_testing(EVERY)
    assert not users, "library modules importing atropos.testing:\n" + "\n".join(users)


def test_exceptions_are_still_needed():
    """An exception that no import needs any more is deleted, so the table stays honest."""
    stale = [
        f"{a} -> {b}"
        for (a, b) in [*MODULE_EXCEPTIONS, *DEFERRED_BACK_EDGES]
        if b not in EVERY.get(a, set())
    ]
    stale += [m for m in TESTING_USERS if not any(part(t) == "testing" for t in EVERY.get(m, ()))]
    assert not stale, f"exceptions no import needs: {stale}"


def test_the_finder_sees_a_cycle_and_a_deferred_import(tmp_path):
    pkg = tmp_path / "atropos"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from atropos import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from atropos import c\n"
        "def f():\n    from . import a\n"
    )
    (pkg / "c.py").write_text("import atropos.a\n")
    top, every = imports(tmp_path)
    assert cycles(top) == []
    assert cycles(every) == [["atropos.a", "atropos.b"]]
    assert "atropos.c" not in every["atropos.b"]


if __name__ == "__main__":  # measure a tree: python tests/test_structure.py [SRC]
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    top, every = imports(src)
    print(f"module-level cycles: {len(cycles(top))}")
    for c in cycles(top):
        print("  " + " <-> ".join(c))
    print(f"cycles counting deferred imports: {len(cycles(every))}")
    for c in cycles(every):
        print("  " + " <-> ".join(c))
    rest = cycles(_without(every, DEFERRED_BACK_EDGES))
    print(f"... without the documented deferred back edges: {len(rest)}")
    print(f"layer breaks: {len(layer_breaks(every))}")
    for b in layer_breaks(every):
        print("  " + b)
    print(f"library imports of testing: {len(library_imports_of_testing(every))}")
    for u in library_imports_of_testing(every):
        print("  " + u)
