"""A multi-turn verifiers taskset with a tool, written for our tests: look up a planet's moons.

Runs in the verifiers venv only. The task's toolset (`Catalogue`, an MCP server verifiers
starts per rollout) offers `moons(planet)`; the harness runs the tool loop.
"""

import re

import verifiers.v1 as vf

MOONS = {"mars": 2, "earth": 1, "neptune": 16, "uranus": 28}


def grade(answer: str, reply: str, tool_calls: int) -> tuple[float, float]:
    """(correct, used_tool)."""
    numbers = re.findall(r"-?\d+", reply)
    return (1.0 if numbers and numbers[-1] == answer else 0.0), (1.0 if tool_calls else 0.0)


class Catalogue(vf.Toolset[vf.ToolsetConfig, vf.State]):
    TOOL_PREFIX = None  # the tool is `moons`, not `catalogue_moons`

    @vf.tool
    async def moons(self, planet: str) -> str:
        """The number of moons of a planet."""
        return str(MOONS.get(planet.strip().lower(), "unknown"))


class MoonData(vf.TaskData):
    planet: str
    answer: str


class MoonTask(vf.Task[MoonData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Catalogue(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task: MoonData, trace: vf.Trace) -> float:
        return grade(task.answer, trace.last_reply, len(trace.tool_messages))[0]

    @vf.reward(weight=0.5)
    async def used_tool(self, task: MoonData, trace: vf.Trace) -> float:
        return grade(task.answer, trace.last_reply, len(trace.tool_messages))[1]


class MoonsTaskset(vf.Taskset[MoonTask]):
    def load(self):
        for planet, count in MOONS.items():
            prompt = f"How many moons does {planet.title()} have? Use the moons tool."
            yield MoonTask(MoonData(prompt=prompt, planet=planet, answer=str(count), name=planet))


__all__ = ["MoonsTaskset"]

if __name__ == "__main__":  # verifiers starts the toolset as `python -m vf_moons`
    Catalogue.run()
