"""openreward's own client through one session of an ORS server; run by the interop venv.

`python ors_session.py URL ENV SPLIT INDEX CALLS_JSON`: lists the environments, splits, task
count and tools, opens a session on task INDEX of SPLIT, reads its prompt and messages, makes
the calls (`[{"name", "input"}]`, stopping at `finished`) and prints one JSON object of it all.
`$OPENREWARD_API_KEY` is sent as the key, when set.
"""

from __future__ import annotations

import json
import sys

from openreward import OpenReward
from openreward.api.environments.client import ToolCallError


def main(url: str, env_name: str, split: str, index: int, calls: list[dict]) -> dict:
    client = OpenReward(base_url=url)
    try:
        env = client.environments.get(name=env_name, variant=env_name, base_url=url)
        report = {
            "splits": env.list_splits(),
            "num_tasks": env.num_tasks(split),
            "tools": [t.name for t in env.list_tools()],
            "task": env.get_task(split, index).task_spec,
            "outputs": [],
        }
        with env.session(split=split, index=index) as session:
            report["prompt"] = "".join(b.text for b in session.get_prompt())
            report["roles"] = [m.role for m in session.get_messages()]
            for call in calls:
                try:
                    out = session.call_tool(call["name"], call["input"])
                except ToolCallError as e:
                    report["outputs"].append({"error": str(e)})
                    continue
                text = "".join(b.text for b in out.blocks)
                report["outputs"].append(
                    {"text": text, "reward": out.reward, "finished": out.finished}
                )
                if out.finished:
                    break
        return report
    finally:
        client.close()


if __name__ == "__main__":
    url, env_name, split, index, calls = sys.argv[1:6]
    print(json.dumps(main(url, env_name, split, int(index), json.loads(calls))))
