"""`agent_tools`: an agent written with the OpenAI Agents SDK answers questions with two tools.

Each rollout runs an `agents.Agent` with a `lookup` tool (the shipped planet catalogue) and a
`calculator` tool against its own session of the rollout proxy (`atropos.proxy.AgentEnv`), so
the trained tokens are the policy's own across every tool round trip. Score: 1.0 when the
agent's final answer states the right number, else 0.0. Needs the `agents` extra (a missing
one is named, with its install command, before the run). Offline demo: `python -m
atropos.testing.fake_server --responder atropos.environments.agent_tools.tasks:demo_responder`.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.agent_tools.tasks import calculator, lookup, make_tasks
from atropos.proxy.agent_env import AgentClient, AgentEnv, AgentEnvConfig, AgentRun

INSTRUCTIONS = (
    "Answer the question about planets. Use lookup(name) for a planet's numbers and"
    " calculator(expression) for arithmetic, then reply with 'The answer is N.'"
)


class AgentToolsConfig(AgentEnvConfig):
    train_tasks: int = Field(default=256, ge=1, description="generated training questions")
    eval_tasks: int = Field(default=32, ge=0, description="generated held-out questions")
    max_tokens_per_call: int = Field(default=256, ge=1, description="tokens per model call")


class AgentTools(AgentEnv[AgentToolsConfig]):
    """Planet questions answered by an OpenAI Agents SDK agent with lookup and calculator."""

    name = "agent_tools"
    requires: ClassVar[dict[str, str]] = {"agents": "agents"}
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 4, "use_wandb": False}

    def load(self) -> list[dict[str, Any]]:
        return make_tasks("train", self.config.train_tasks, self.seed)

    def load_eval(self) -> list[dict[str, Any]]:
        return make_tasks("test", self.config.eval_tasks, self.seed)

    async def agent(self, task: dict[str, Any], client: AgentClient) -> Any:
        import agents

        agents.set_tracing_disabled(True)  # nothing leaves this machine

        @agents.function_tool(name_override="lookup")
        def lookup_tool(name: str) -> str:
            """A planet's number of moons, rings and volcanoes."""
            return json.dumps(lookup(name))

        @agents.function_tool(name_override="calculator")
        def calculator_tool(expression: str) -> str:
            """Evaluate integer arithmetic: +, -, * and parentheses."""
            return calculator(expression)

        model = agents.OpenAIResponsesModel(model=client.model, openai_client=client.openai)
        settings = agents.ModelSettings(max_tokens=self.config.max_tokens_per_call)
        solver = agents.Agent(
            name="planet-solver",
            instructions=INSTRUCTIONS,
            tools=[lookup_tool, calculator_tool],
            model=model,
            model_settings=settings,
        )
        result = await agents.Runner.run(
            solver, task["question"], max_turns=self.config.max_agent_turns
        )
        return result.final_output

    def score(self, task: dict[str, Any], run: AgentRun) -> float:
        numbers = re.findall(r"-?\d+", str(run.output or ""))
        return 1.0 if numbers and numbers[-1] == task["answer"] else 0.0
