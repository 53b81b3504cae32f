"""Fixtures shared across test folders: a tiny random causal LM for the trainer and its metrics
tests, a headless Chromium for the browser tests (`browser`: Debian's, through Playwright;
`attacker_site`: a page on another loopback port; `recorder`: the requests a server saw), real
vLLM servers (`vllm_server`, `vllm_lora_server`, `vllm_servers`) and real SGLang servers
(`sglang_server`, `sglang_servers`; opt-in: ATROPOS_TEST_SGLANG=1). Under CI (`CI` set)
hypothesis draws the same examples every run, so CI's verdict on a commit does not depend
on luck; a developer's runs keep exploring new ones."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from atropos.testing.server_process import ServerProcess
from atropos.testing.sglang import SGLangServer, cuda_stub
from atropos.testing.vllm import LORA_ARGS, LORA_ENV, VLLMServer

ROOT = Path(__file__).resolve().parents[1]
SGLANG_OPT_IN = "ATROPOS_TEST_SGLANG"  # =1 runs the SGLang tests (`make test-sglang`)

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

#: Under pytest-xdist (`make test` runs two workers: scripts/check), the tests that share a
#: heavy thing run on one worker, one after another: the test files under each prefix here
#: are one unit of work (`Grouped`); any other file is a unit of its own. A group holds every
#: file whose tests use the session fixture that starts or builds its thing (checked at
#: collection: `_check_groups`), so a vLLM server, Docker engine or venv is made by one worker.
_GROUPS = {
    "tests/vllm/": "vllm",
    "tests/sglang/": "sglang",
    "tests/sandbox_engine/": "docker",
    "tests/environments/test_harbor_engine.py": "docker",
    "tests/harnesses/test_harbor_harness.py": "docker",
    "tests/interop/": "interop",  # and TRL's venv: test_trl_ors uses both
    "tests/integrations/test_trl.py": "interop",
    "tests/compat/": "compat",
    "tests/environments/test_verifiers.py": "verifiers",
    "tests/launch/test_ray": "ray",
    "tests/launch/test_slurm": "slurm",
}
#: The session fixtures that start or build a heavy thing, and the group of their tests.
_HEAVY = {
    "vllm_python": "vllm",
    "sglang_python": "sglang",
    "docker_engine": "docker",
    "interop_python": "interop",
    "trl_python": "interop",
    "upstream_python": "compat",
}


def group_of(nodeid: str) -> str | None:
    """The group of the test `nodeid` (its path from the root first), or None."""
    return next((g for prefix, g in _GROUPS.items() if nodeid.startswith(prefix)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler, by `_GROUPS` (its own `loadgroup` cannot mark tests on pytest 9)."""
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        """A group's files are one unit of work, any other file one; the units with the most
        tests go first (xdist's reorder), so the long groups start at once."""

        def _split_scope(self, nodeid: str) -> str:
            group = group_of(nodeid)
            return f"group:{group}" if group else nodeid.split("::", 1)[0]

    return Grouped(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_groups(items)


def _check_groups(items: list[pytest.Item]) -> None:
    """Every test using a heavy fixture is in its group (else two workers would each make it)."""
    wrong = sorted(
        {
            f"{item.nodeid.split('::', 1)[0]} uses {name}: add it to _GROUPS as {group!r}"
            for item in items
            for name, group in _HEAVY.items()
            if name in item.fixturenames and group_of(item.nodeid) != group
        }
    )
    if wrong:
        raise pytest.UsageError("tests/conftest.py: " + "; ".join(wrong))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random causal LM in Hugging Face format, built once per session (no downloads)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from atropos.inference.tokenizer import load_tokenizer
    from atropos.testing import tiny_tokenizer_path

    torch.manual_seed(0)
    tok = load_tokenizer(tiny_tokenizer_path())
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny-model")
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def upstream_python(flavour: str) -> Path:
    """The python of `scripts/upstream_venv.py FLAVOUR`'s venv (made on first use)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "upstream_venv.py"), flavour],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    sys.stderr.write(done.stderr)
    lines = done.stdout.strip().splitlines()
    said = "\n".join(done.stderr.strip().splitlines()[-15:])
    assert done.returncode == 0 and lines, f"could not make the {flavour} venv; it said:\n{said}"
    print(f"[{flavour}] venv ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return Path(lines[-1])


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's python (`scripts/upstream_venv.py vllm`, made on first use from
    requirements/vllm.txt: about 2 minutes)."""
    return upstream_python("vllm")


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The SGLang venv's python (`scripts/upstream_venv.py sglang`, made on first use from
    requirements/sglang.txt: 11 GB, 5 to 8 minutes) with its stub libcuda built; skipped
    unless ATROPOS_TEST_SGLANG=1 (docs/inference.md, "SGLang on a CPU")."""
    if os.environ.get(SGLANG_OPT_IN) != "1":
        pytest.skip(
            "SGLang tests are opt-in (an 11 GB venv, minutes to build):"
            f" run `make test-sglang`, or set {SGLANG_OPT_IN}=1"
        )
    python = upstream_python("sglang")
    cuda_stub(python)
    return python


def _frozen(value: Any) -> Any:
    """`value` with lists as tuples and mappings as sorted item tuples (equal options, one key)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


class Servers:
    """Real servers of one kind (`VLLMServer`, `SGLangServer`) for the whole test run, one per
    distinct configuration, started on first request and stopped at the end of the session.

    `get(**options)` takes the kind's keyword options (`extra_args`, `extra_env`,
    `served_model_name`, `max_model_len`, ...) and returns the running server started with
    them. A test that changes a server's state (weights, adapters, pause) and cannot undo it
    asks for one of its own with `private="why"`: the key only, never an argument of the server.
    """

    def __init__(
        self, python: Path, base_dir: Path, kind: type[ServerProcess] = VLLMServer
    ) -> None:
        self.python, self.base_dir, self.kind = python, base_dir, kind
        self.running: dict[str, ServerProcess] = {}

    def get(self, private: str = "", **options: Any) -> Any:
        key = repr((private, sorted((k, _frozen(v)) for k, v in options.items())))
        server = self.running.get(key)
        if server is None:
            server = self.kind(self.python, self.base_dir, **options)
            server.start()
            self.running[key] = server
            name = self.kind.log_name
            print(f"[{name}] {server!r} ready in {server.started_in:.1f} s", file=sys.stderr)
        return server

    def stop(self) -> None:
        for server in self.running.values():
            server.stop()
        self.running.clear()


@pytest.fixture(scope="session")
def vllm_servers(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The session's vLLM servers (see `Servers`); all stopped by pid at the end."""
    servers = Servers(vllm_python, tmp_path_factory.mktemp("vllm"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def vllm_server(vllm_servers: Servers) -> VLLMServer:
    """vLLM serving the shipped tiny policy as "atropos-tiny" in float32 (no LoRA)."""
    return vllm_servers.get()


@pytest.fixture(scope="session")
def vllm_lora_server(vllm_servers: Servers) -> VLLMServer:
    """vLLM serving the tiny policy with runtime LoRA adapters on (`/v1/load_lora_adapter`).
    A separate instance: vLLM 0.32's CPU LoRA path dies on prompt_logprobs requests."""
    return vllm_servers.get(extra_args=LORA_ARGS, extra_env=LORA_ENV)


@pytest.fixture(scope="session")
def sglang_servers(
    sglang_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Servers]:
    """The session's SGLang servers (see `Servers`); all stopped by pid at the end."""
    servers = Servers(sglang_python, tmp_path_factory.mktemp("sglang"), SGLangServer)
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def sglang_server(sglang_servers: Servers) -> SGLangServer:
    """SGLang serving the shipped tiny policy as "atropos-tiny" on the CPU in float32."""
    return sglang_servers.get()


def chromium_path() -> str:
    """Debian's chromium (installed by `make chromium`); never a downloaded browser."""
    found = shutil.which("chromium")
    if found is None and Path("/usr/bin/chromium").exists():
        found = "/usr/bin/chromium"
    if found is None:
        pytest.fail("chromium is not installed: run `make chromium` (Debian's package)")
    return found


@pytest.fixture(scope="module")  # a live Playwright loop must not outlive the module
def browser() -> Iterator[Any]:
    """A headless Chromium (Debian's, through Playwright's sync API), one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


ATTACK_KIT = """const api = "API";
const plan = PLAN;
const results = {};
let frames = 0;
const waits = [];
const settle = (name, promise) => waits.push(Promise.race([
  promise.then(r => { results[name] = r.type === "opaque" ? "opaque" : r.status; },
               e => { results[name] = "rejected: " + e; }),
  new Promise(done => setTimeout(() => { results[name] = results[name] || "no answer"; done(); },
                                 4000)),
]));
const text = (path, body) => settle("text " + path, fetch(api + path, {
  method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: body}));
const blob = (path, body) => settle("blob " + path, fetch(api + path, {
  method: "POST", mode: "no-cors", body: new Blob([body])}));
const form = (path, doc) => waits.push(new Promise(done => {
  const frame = document.createElement("iframe");
  frame.name = "sink" + frames++;
  document.body.appendChild(frame);
  const f = document.createElement("form");
  f.method = "POST"; f.action = api + path; f.enctype = "text/plain"; f.target = frame.name;
  const input = document.createElement("input");  // sends NAME=VALUE: {..., "x": "="}
  input.name = JSON.stringify(doc).slice(0, -1) + ',"x":"';
  input.value = '"}';
  f.appendChild(input);
  document.body.appendChild(f);
  frame.onload = done;
  setTimeout(done, 4000);
  f.submit();
}));
"""
"""What an attacker's page has at hand: `text(path, body)` (a no-cors text/plain fetch),
`blob(path, body)` (a no-cors fetch with a typeless Blob), `form(path, doc)` (a text/plain form
POST into a frame), `settle`, `results` (name -> status, "opaque", "rejected..." or "no
answer") and `waits` (a promise per request sent); `plan` and `api` are the page's inputs."""


@pytest.fixture(scope="session")
def attack_page() -> Callable[[str, Any, str], str]:
    """`attack_page(api_url, plan, script)`: an attacker's HTML page: `ATTACK_KIT` with `api`
    and `plan` (JSON) filled in, then `script`."""

    def page(url: str, plan: Any, script: str) -> str:
        kit = ATTACK_KIT.replace("API", url).replace("PLAN", json.dumps(plan))
        return f"<!doctype html><html><body><script>\n{kit}{script}"

    return page


@pytest.fixture
def attacker_site(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A static web server on another loopback port: the attacker's origin. Yields the folder
    it serves and its origin (`http://127.0.0.1:PORT`)."""
    from atropos.net import free_port

    port = free_port()
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, name="attacker", daemon=True)
    thread.start()
    try:
        yield tmp_path, f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class Recorder:
    """An ASGI wrapper that notes every HTTP request reaching `app`: `seen` holds (method,
    path), `heads` (method, path, headers as a dict of lower-case names) and `answers` (method,
    path, the status the app answered)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str]] = []
        self.heads: list[tuple[str, str, dict[str, str]]] = []
        self.answers: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        self.seen.append((method, path))
        heads = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.heads.append((method, path, heads))

        async def noting(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.answers.append((method, path, message["status"]))
            await send(message)

        await self.app(scope, receive, noting)

    def clear(self) -> None:
        self.seen.clear()
        self.heads.clear()
        self.answers.clear()


@pytest.fixture(scope="session")
def recorder() -> type[Recorder]:
    """`recorder(app)`: `app` wrapped in a `Recorder` (a class test modules cannot import from
    here: this conftest is not a package module)."""
    return Recorder


@pytest.fixture(scope="session")
def trl_python() -> Path:
    """The TRL venv's python (`scripts/upstream_venv.py trl`: TRL 1.16 with this project
    editable, made on first use from requirements/trl.txt: about a minute)."""
    return upstream_python("trl")


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Docker engine of this session's own (`atropos.testing.docker.DockerEngine`: Debian's
    dockerd and containerd from a temporary folder, on a unix socket there; `make docker`
    installs them). `.host` is its `DOCKER_HOST`, `.environ` an environment with it set,
    `.docker(args)` runs the client against it. Stopped by pid at the end, nothing left."""
    from atropos.testing.docker import DockerEngine, docker_unavailable_reason

    reason = docker_unavailable_reason()
    if reason is not None:
        pytest.fail(reason)
    engine = DockerEngine(tmp_path_factory.mktemp("docker"))
    engine.start()
    print(f"[docker] {engine!r} ready in {engine.started_in:.1f} s", file=sys.stderr)
    try:
        yield engine
    finally:
        engine.stop()


SANDBOX_IMAGE = "atropos-test-sandbox:bookworm"
SANDBOX_PACKAGES = ("python3", "python3-pytest", "bash")


@pytest.fixture(scope="session")
def sandbox_image(docker_engine: Any) -> str:
    """The name of the sandbox tests' image on `docker_engine`: a Debian bookworm root with
    python3, bash and pytest, built once per machine from the package mirrors (about 20 s)
    and loaded from `docker save`'s archive in the image cache afterwards (`atropos.images`)."""
    from atropos.images import DebianRoot, ensure_image

    started = time.monotonic()
    recipe = DebianRoot(include=SANDBOX_PACKAGES)
    how = ensure_image(SANDBOX_IMAGE, recipe, env=docker_engine.environ)
    print(f"[docker] {SANDBOX_IMAGE} {how} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return SANDBOX_IMAGE
