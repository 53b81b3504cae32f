"""The offline demo responder of the multimodal environments, for `FakeInferenceServer`.

It cannot see the picture. It reads the `[item ID]` tag that ends the question and looks the
item up: among the items loaded in this process (hub items, and any settings), or else, for a
generated id (`clock-17`), the item of that seed made again with the env's default settings (a
fake server in a process of its own). It answers right on every other call and wrongly on the
others, so groups are mixed; in `\\boxed{}` when the prompt asks for it, else in `<answer>`
tags. For prompts without a known tag it returns None (the fake server's random text).

    python -m atropos.testing.fake_server --port 9001 \\
        --responder atropos.environments.multimodal.demo:demo_responder
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from atropos.environments.common.demo import Alternating
from atropos.environments.multimodal.base import KINDS, LOADED, VisionEnv

__all__ = ["demo_responder"]

MEMBERS = ("clevr", "clock_reading", "ocr_vqa", "pixmo_count")  # modules of the family
_TAG = re.compile(r"\[item ([\w.-]+)\]")
_turns = Alternating()


def _find(item_id: str) -> tuple[type[VisionEnv[Any]], dict[str, Any]] | None:
    for member in MEMBERS:  # the classes register their kinds when imported
        importlib.import_module(f"atropos.environments.multimodal.{member}")
    kind, _, rest = item_id.partition("-")
    cls = KINDS.get(kind)
    if cls is None:
        return None
    if item_id in LOADED:
        return cls, LOADED[item_id]
    if not rest.isdigit():
        return None  # a hub item of another process: nothing to go on
    return cls, cls.generated_item(cls.env_config_cls(), int(rest))


def demo_responder(prompt_text: str) -> str | None:
    """A reply to the prompt whose question ends in `[item ID]` (see the module docstring)."""
    found = _TAG.findall(prompt_text)
    hit = _find(found[-1]) if found else None
    if hit is None:
        return None
    cls, item = hit
    answer = str(item["answer"]) if _turns.right() else cls.wrong_answer(item)
    shown = f"\\boxed{{{answer}}}" if "\\boxed{" in prompt_text else f"<answer>{answer}</answer>"
    return f"<think>I look at each part of the picture in turn.</think>\n{shown}"
