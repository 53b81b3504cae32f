"""openenv-core's own client (`GenericEnvClient`, over the /ws session) playing episodes of an
OpenEnv server: `python drive.py URL PLAN`, where PLAN is JSON `[{"seed": s, "replies": [...]},
...]`; prints JSON, one record per episode (the reset prompt, each step's reward, done and
prompt, the state at the end)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from openenv.core.generic_client import GenericEnvClient


async def play(url: str, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    records = []
    async with GenericEnvClient(base_url=url, message_timeout_s=120.0) as env:
        for episode in plan:
            result = await env.reset(seed=episode["seed"])
            record: dict[str, Any] = {"prompt": result.observation.get("prompt"), "steps": []}
            for reply in episode["replies"]:
                result = await env.step({"message": reply})
                step = {"reward": result.reward, "done": result.done}
                record["steps"].append({**step, "prompt": result.observation.get("prompt")})
                if result.done:
                    break
            record["state"] = await env.state()
            records.append(record)
    return records


if __name__ == "__main__":
    print(json.dumps(asyncio.run(play(sys.argv[1], json.loads(sys.argv[2])))))
