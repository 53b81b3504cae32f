"""A multi-tool OpenEnv environment (an `MCPEnvironment` with FastMCP tools), for the tests.

`reset(seed)` asks for (a + b) * c. Tools: `add(a, b)`, `multiply(a, b)` (reward 0.1 per
call that is useful: its result is a step toward the answer) and `submit(answer)`, which ends
the episode with reward 1.0 when the answer is right, else 0.0.
"""

from __future__ import annotations

import random
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server import Action, Observation, State
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction


class TaskObservation(Observation):
    task: str = ""


class ToolsEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("arith-tools")

        @mcp.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        @mcp.tool
        def submit(answer: int) -> str:
            """Submit the final answer."""
            return "submitted"

        super().__init__(mcp)
        self._state = State(step_count=0)
        self.numbers = (0, 0, 0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        rng = random.Random(seed)
        self.numbers = (rng.randint(1, 9), rng.randint(1, 9), rng.randint(2, 9))
        self._state = State(episode_id=episode_id, step_count=0)
        a, b, c = self.numbers
        return TaskObservation(task=f"Compute ({a} + {b}) * {c} with the tools, then submit it.")

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Any:
        return Observation(done=False, reward=0.0)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Any:
        obs = await super().step_async(action, timeout_s=timeout_s, **kw)
        if isinstance(action, CallToolAction):
            self._state.step_count += 1
            a, b, c = self.numbers
            if action.tool_name == "submit":
                obs.done = True
                obs.reward = 1.0 if action.arguments.get("answer") == (a + b) * c else 0.0
            else:
                useful = action.arguments in ({"a": a, "b": b}, {"a": a + b, "b": c})
                obs.reward = 0.1 if useful else 0.0
        return obs

    def step(self, action: Action, timeout_s: float | None = None, **kw: Any) -> Any:
        raise NotImplementedError("served through step_async")

    @property
    def state(self) -> State:
        return self._state
