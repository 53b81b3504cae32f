"""Score the completions of a groups file with verifiers' own rubric (runs in the verifiers venv).

Usage: python rescore.py TASKSET GROUPS.jsonl  -> prints one JSON list of scores per group.
Each row's conversation (its `messages`) becomes a verifiers `Trace` (a chain of message
nodes, the assistant ones marked sampled) of the task whose prompt it starts with, and
`Task.score(trace)` runs the task's reward functions; the row's score is `Trace.reward`.
"""

import asyncio
import json
import sys

import verifiers.v1 as vf
from pydantic import TypeAdapter
from verifiers.v1.graph import MessageNode

MESSAGE = TypeAdapter(vf.Message)


async def score(task: vf.Task, messages: list[dict]) -> float:
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
    )
    parent = None
    for message in messages:
        node = MessageNode(
            parent=parent,
            message=MESSAGE.validate_python(message),
            sampled=message["role"] == "assistant",
        )
        trace.nodes.append(node)
        parent = len(trace.nodes) - 1
    await task.score(trace)
    return trace.reward


async def main(taskset_id: str, path: str) -> None:
    config = vf.resolve_env_config({"taskset": {"id": taskset_id}})
    taskset = vf.load_taskset(config.taskset)
    by_prompt = {task.data.prompt_text: task for task in taskset}
    for line in open(path):
        group = json.loads(line)
        scores = []
        for messages in group["messages"]:
            prompt = next(m["content"] for m in messages if m["role"] == "user")
            scores.append(await score(by_prompt[prompt], messages))
        print(json.dumps(scores))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
