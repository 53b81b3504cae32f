"""The math environment's data: training problems (DeepMath-shaped) and the eval subsets.

Offline, the fixtures we wrote under `atropos/environments/data/math/` are used: `train.jsonl`
(`question`, `final_answer`) and `eval/{aime24,math500,amc23}.jsonl` in the shapes of the hub
sets they stand in for. The hub is read only when asked (`--env.dataset_name`,
`--env.eval_from_hub`).

>>> to_item({"question": "1+1?", "final_answer": "2"})
{'mode': 'normal', 'question': '1+1?', 'answer': '\\\\boxed{2}'}
>>> to_item({"question": "?", "final_answer": None}) is None
True
>>> eval_item({"problem": "2+2?", "answer": 4}, "aime24")["answer"]
'\\\\boxed{4}'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.environments.math.scoring import as_boxed

__all__ = ["HUB_EVAL_SETS", "TRAIN_HUB", "eval_item", "eval_items", "to_item", "train_items"]

TRAIN_HUB = "zwhe99/DeepMath-103K"
HUB_EVAL_SETS = {  # subset name -> (hub dataset, split), as upstream evaluated
    "aime24": ("HuggingFaceH4/aime_2024", "train"),
    "math500": ("HuggingFaceH4/math-500", "test"),
    "amc23": ("math-ai/amc23", "test"),
}


def to_item(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """A normal-mode item from a DeepMath row; None when the row has no usable answer."""
    question, answer = row.get("question"), row.get("final_answer")
    if not isinstance(question, str) or answer is None or not str(answer).strip():
        return None
    return {"mode": "normal", "question": question, "answer": as_boxed(answer)}


def train_items(dataset_name: str | None = None) -> list[dict[str, Any]]:
    """The training items: the shipped fixture, or the hub dataset's train split."""
    rows = load_hub(dataset_name, "train") if dataset_name else read_jsonl(_fixture("train"))
    return [item for item in map(to_item, rows) if item is not None]


def eval_item(row: Mapping[str, Any], subset: str) -> dict[str, Any]:
    """An eval item: the problem (`problem` or `question`), its boxed answer, its subset."""
    question = row.get("problem", row.get("question"))
    return {"question": str(question), "answer": as_boxed(row["answer"]), "subset": subset}


def eval_items(from_hub: bool = False) -> list[dict[str, Any]]:
    """Every eval item of the three subsets, from the fixtures or (`from_hub`) the hub."""
    items: list[dict[str, Any]] = []
    for subset, (name, split) in HUB_EVAL_SETS.items():
        rows = load_hub(name, split) if from_hub else read_jsonl(_fixture(f"eval/{subset}"))
        items.extend(eval_item(row, subset) for row in rows)
    return items


def _fixture(stem: str) -> Any:
    return data_path("math", *f"{stem}.jsonl".split("/"))
