"""A Harbor task's sandbox: the docker provider's container with `profile="task"`.

Harbor runs a task in an ordinary container of its image: the agent edits the image's files
(`/app/...`), the verifier is copied to `/tests` and writes `/logs/verifier`, the oracle is
copied to `/solution`, and scripts may `chown` or `su`. The task profile (docs/sandbox.md)
is that container: a writable root (the container's own layer, gone with it), the image's own
work dir, Docker's default capabilities (no-new-privileges stays), and everything else of the
provider unchanged (local image only, no network, the spec's limits, exec deadlines, labels
and the sweep of dead owners).

The other providers (`--env.provider bubblewrap|process`) have no task profile and are opened
as they are: they have no images, so only tasks that need none of the above could run there.
"""

from __future__ import annotations

from dataclasses import replace

from atropos.sandbox import Sandbox, SandboxSpec, open_sandbox

__all__ = ["open_task_sandbox"]


async def open_task_sandbox(spec: SandboxSpec, provider: str, start_timeout: float) -> Sandbox:
    """A started sandbox for a task: on docker with the task profile, else the provider's
    own sandbox."""
    if provider == "docker":
        spec = replace(spec, profile="task")
    return await open_sandbox(spec, provider, start_timeout)
