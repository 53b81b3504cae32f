"""Running model-written Python, and judging it, in an `atropos.sandbox` sandbox.

`CodeRunner.arun(program, stdin, tests)` opens one fresh sandbox per run (provider
`bubblewrap`, `process` or `docker`), runs the sandbox's own `python3 -I -S` on `_runner`
(the program, or the judge of `_harness` against it), and closes the sandbox, which ends every
process the run left. Limits map to `SandboxSpec`: `cpu_seconds` (RLIMIT_CPU; `_runner` sets
the soft limit one second lower so an endless loop dies of SIGXCPU), `memory_bytes`
(RLIMIT_AS), `max_processes` (`pids`, plus the judge and the candidate), `file_bytes`
(RLIMIT_FSIZE), `output_bytes` (kept per stream), and `timeout` (the exec's deadline).

Provider `auto` (the default) resolves once, predictably, and is logged once: `docker` when an
image is named (the image's `python3` runs the code), else `bubblewrap` when `bwrap` is
installed (it isolates more: its own root and PID namespace), else `process`. We do not pick
docker by sensing an engine: a test run or a laptop with Docker but no image would change
interpreter and isolation under the user's feet.

Threat model: *accidents and sloppiness* of generated code during RL, not code written to
attack you (same kernel: use a VM or gVisor for that). Where each protection now lives:

- **By the provider** (docs/sandbox.md has the table, tested in tests/sandbox/): no network
  (own network namespace); endless code (RLIMIT_CPU, the exec's deadline, SIGKILL of the
  whole tree); fork bombs (RLIMIT_NPROC on the sandbox's own uid, as root); memory and file
  size (RLIMIT_AS, RLIMIT_FSIZE); output past `output_bytes` read and dropped; a dedicated
  uid per sandbox (the invoking user's 0600 files, other sandboxes' work dirs out of reach; no
  capabilities, no new privileges); every process gone at close, or swept after our death.
  **bubblewrap** also gives the private root the old supervisor built by hand: a read-only
  system, a tmpfs `/tmp`, the work dir the only writable place, its own PID namespace and
  `/proc`, and nothing of the project, the dataset, `/run` or `/var` (no Unix socket files).
- **By `_runner` in the sandbox** (defence in depth, Python-level): an audit hook refusing
  sockets, ctypes, writes outside the work dir, other processes' `/proc` entries, and new
  processes wherever RLIMIT_NPROC does not hold (not root: no dedicated uid, so no count).
- **By the judge** (`_harness`, unchanged): the tests run in another process than the code,
  which cannot forge the verdict (the judge's exit code), read the tests, or win with objects
  equal to everything.
- **Dropped with the `process` provider** (say `bubblewrap` where it matters): the private
  root. The code sees the host's file system as its uid may: world-readable files (a
  world-readable dataset with held-out references included), world-writable `/tmp` and
  `/dev/shm` (for native code and exec'd programs; Python-level writes are refused), Unix
  sockets of mode 0666, and other processes' command lines. The old supervisor's fallback
  (every mount remounted read-only in a mount namespace) is not kept: bubblewrap is the
  provider that does mounts.
- **Changed**: output past the cap no longer kills the run at once (the provider reads and
  drops it), so an output bomb holds its slot until it exits or its deadline; the status is
  still `output_limit`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import signal
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

from atropos.sandbox import PROVIDERS, ExecResult, SandboxSpec, open_sandbox

__all__ = ["GRACE_SECONDS", "CodeRunner", "RunResult", "resolve_provider"]

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
RUNNER = (HERE / "_runner.py").read_text()
HARNESS = (HERE / "_harness.py").read_text()
SETUP_FAILED = 125  # `_runner.SETUP_FAILED`
VERDICTS = {0: "passed", 1: "error", 3: "exited_early"}  # the judge's exit code (`_runner`)
GRACE_SECONDS = 5.0  # a run's start and close, beyond its deadline
PROVIDER_NAMES = ("auto", "bubblewrap", "process", "docker")
_logged: set[tuple[str, str]] = set()


@dataclass
class RunResult:
    """What one run did.

    `status` is one of: `ok` (exit code 0), `error` (another exit code), `timeout` (the
    deadline), `cpu_limit` (SIGXCPU), `output_limit`, `file_limit` (SIGXFSZ), `killed` (another
    signal) or `sandbox_error` (`_runner` could not set up). A sandbox that fails to start or
    dies is not a result: `arun` raises `SandboxError`.
    """

    status: str
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    provider: str
    tests: str | None = None  # `arun(..., tests=...)`: "passed", "error" or "exited_early"

    @property
    def ok(self) -> bool:
        """Whether the program ran to the end and exited with 0."""
        return self.status == "ok"


def resolve_provider(name: str, image: str | None) -> tuple[str, str]:
    """The provider `name` means here, and why; `ValueError` naming the fix when it cannot be
    had (an unknown name, docker without an image or without its provider)."""
    if name not in PROVIDER_NAMES:
        raise ValueError(f"sandbox_provider must be one of {', '.join(PROVIDER_NAMES)}: {name!r}")
    if name == "auto":
        if image:
            name, why = "docker", f"auto: sandbox_image {image!r} is set"
        elif shutil.which("bwrap"):
            return "bubblewrap", "auto: no sandbox_image, bwrap is installed"
        else:
            return "process", "auto: no sandbox_image, no bwrap (apt-get install bubblewrap)"
    else:
        why = "asked for"
    if name == "docker":
        if not image:
            raise ValueError("sandbox_provider docker needs sandbox_image (an image with python3)")
        if "docker" not in PROVIDERS:
            known = ", ".join(sorted(PROVIDERS))
            raise ValueError(
                f"sandbox_image {image!r} needs the docker provider, which atropos.sandbox does"
                f" not have here (it has {known}); unset sandbox_image or pick one of those"
            )
    return name, why


class CodeRunner:
    """Runs Python programs, alone or judged by tests, one fresh sandbox each, at most
    `max_concurrency` at once.

    >>> runner = CodeRunner(timeout=10)
    >>> result = runner.run("print(sum(range(10)))")
    >>> result.status, result.stdout
    ('ok', '45\\n')
    """

    def __init__(
        self,
        *,
        provider: str = "auto",
        image: str | None = None,
        timeout: float = 10.0,
        cpu_seconds: float = 5.0,
        memory_bytes: int = 1 << 30,
        max_processes: int = 16,
        file_bytes: int = 16 << 20,
        output_bytes: int = 1 << 20,
        max_concurrency: int = 4,
        start_timeout: float = 30.0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if not timeout > 0 or not cpu_seconds > 0:
            raise ValueError(f"timeout and cpu_seconds must be positive: {timeout}, {cpu_seconds}")
        self.provider, why = resolve_provider(provider, image)
        if (self.provider, why) not in _logged:
            _logged.add((self.provider, why))
            log.info("code_execution: sandbox provider %s (%s)", self.provider, why)
        self.cpu_seconds = max(1, math.ceil(cpu_seconds))
        self.spec = SandboxSpec(
            image=image if self.provider == "docker" else None,
            memory_bytes=memory_bytes,
            pids=max_processes + 2,  # the judge and the candidate
            disk_bytes=file_bytes,
            cpu_seconds=self.cpu_seconds + 1,  # the hard limit; `_runner` sets the soft one
            output_bytes=output_bytes,
        )
        self.timeout, self.start_timeout = timeout, start_timeout
        self.max_concurrency = max_concurrency
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._gates = weakref.WeakKeyDictionary()

    def with_spec(self, **changes: object) -> CodeRunner:
        """A copy whose `SandboxSpec` has `changes` (tests: a smaller file size, say)."""
        other = object.__new__(CodeRunner)
        other.__dict__.update(self.__dict__, _gates=weakref.WeakKeyDictionary())
        other.spec = replace(self.spec, **changes)  # type: ignore[arg-type]
        return other

    def run(self, program: str, stdin: str = "", tests: str | None = None) -> RunResult:
        """`arun` from synchronous code (no event loop running in this thread)."""
        return asyncio.run(self.arun(program, stdin, tests))

    async def arun(self, program: str, stdin: str = "", tests: str | None = None) -> RunResult:
        """Run `program` (Python source) with `stdin`, waiting for a free slot.

        With `tests` (Python source: asserts), `program` is the code under test and `tests` run
        against its names in another process (`_harness`); `RunResult.tests` is the verdict,
        which the program cannot forge. Raises `SandboxError` when the sandbox itself fails.
        """
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(self.max_concurrency)
        code = program.encode()
        rest = (tests if tests is not None else stdin).encode()
        mode = "program" if tests is None else "tests"
        argv = ["python3", "-I", "-S", "-c", RUNNER, mode, HARNESS, str(self.cpu_seconds)]
        async with gate:
            box = await open_sandbox(self.spec, self.provider, self.start_timeout)
            async with box:
                run = box.exec(argv, self.timeout, stdin=b"%d\n" % len(code) + code + rest)
                try:  # a backstop: the exec's own deadline ends it first
                    done = await asyncio.wait_for(run, self.timeout + GRACE_SECONDS)
                except asyncio.TimeoutError:
                    return RunResult("timeout", None, None, "", "", self.provider)
        return self._result(done, judged=tests is not None)

    def _result(self, done: ExecResult, judged: bool) -> RunResult:
        code, timed_out, truncated = done.exit_code, done.timed_out, done.truncated
        stdout = done.stdout.decode("utf-8", "replace")
        stderr = done.stderr.decode("utf-8", "replace")
        sig = -code if code < 0 else None  # every provider reports signal n as -n
        if truncated:
            status = "output_limit"
        elif timed_out:
            status = "timeout"
        elif sig == signal.SIGXCPU:
            status = "cpu_limit"
        elif sig == signal.SIGXFSZ:
            status = "file_limit"
        elif sig is not None:
            status = "killed"
        elif code == SETUP_FAILED and stderr.startswith("sandbox setup failed"):
            status = "sandbox_error"
        else:
            status = "ok" if code == 0 else "error"
        verdict = VERDICTS.get(code) if judged and status in ("ok", "error") else None
        exit_code = None if sig is not None or timed_out else code
        return RunResult(status, exit_code, sig, stdout, stderr, self.provider, verdict)
