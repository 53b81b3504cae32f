"""A Harbor task's sandbox: the docker provider's container, opened as a task container.

Harbor runs a task in an ordinary container of its image: the agent edits the image's files
(`/app/...`), the verifier is copied to `/tests` and writes `/logs/verifier`, the oracle is
copied to `/solution`, and scripts may `chown` or `su`. The docker provider's default sandbox
is built for untrusted snippets instead: a read-only root, the work dir an empty tmpfs that
hides the image's files there, every capability dropped. A task container keeps everything
else of the provider (local image only, no network, the spec's memory, pids, cores and disk
limits, exec deadlines that kill the whole tree, labels and the sweep of dead owners) and
changes three things: the root is writable (the container's own layer, gone with it), the
work dir is the image's own folder, and Docker's default capabilities are kept
(no-new-privileges stays).

The other providers (`--env.provider bubblewrap|process`) are opened as they are: they have
no images, so only tasks that need none of the above could run there.
"""

from __future__ import annotations

from typing import Any

from atropos.sandbox import Sandbox, SandboxSpec, open_sandbox

__all__ = ["open_task_sandbox", "task_container_config"]


def task_container_config(body: dict[str, Any], workdir: str) -> dict[str, Any]:
    """The docker provider's container body made a task container's: a writable root, the
    image's own `workdir`, Docker's default capabilities."""
    host = body["HostConfig"]
    host["ReadonlyRootfs"] = False
    host["Mounts"] = [m for m in host.get("Mounts", []) if m.get("Target") != workdir]
    host.pop("CapDrop", None)
    return body


async def open_task_sandbox(spec: SandboxSpec, provider: str, start_timeout: float) -> Sandbox:
    """A started sandbox for a task: the docker provider's container as a task container, else
    the provider's own sandbox."""
    if provider != "docker":
        return await open_sandbox(spec, provider, start_timeout)
    from atropos.sandbox.docker import DockerSandbox  # the provider is imported when used

    class TaskContainer(DockerSandbox):
        def config(self) -> dict[str, Any]:
            return task_container_config(super().config(), self.spec.workdir)

    return await TaskContainer(spec).start(start_timeout)
