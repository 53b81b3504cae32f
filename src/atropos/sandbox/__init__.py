"""One Sandbox API (exec, put/get, close) over local providers (bubblewrap, process), with
pools and a sweep of what dead owners left. docs/sandbox.md says what each isolates."""

from atropos.sandbox._host import sweep
from atropos.sandbox.pool import SandboxPool
from atropos.sandbox.providers import PROVIDERS, open_sandbox
from atropos.sandbox.spec import ExecResult, Sandbox, SandboxError, SandboxSpec

__all__ = [
    "PROVIDERS",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxSpec",
    "open_sandbox",
    "sweep",
]
