"""One Sandbox API (exec, put/get, close) over local providers (bubblewrap, process) and
Docker containers (docker), with pools, a sweep of what dead owners left, and `run_owned` for
owners that must clean up on SIGTERM. docs/sandbox.md says what each isolates."""

from atropos.sandbox.owner import run_owned
from atropos.sandbox.pool import SandboxPool
from atropos.sandbox.providers import PROVIDERS, open_sandbox, sweep
from atropos.sandbox.spec import ExecResult, Sandbox, SandboxError, SandboxSpec

__all__ = [
    "PROVIDERS",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxSpec",
    "open_sandbox",
    "run_owned",
    "sweep",
]
