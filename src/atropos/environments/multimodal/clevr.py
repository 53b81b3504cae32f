"""`clevr`: counting and compositional questions about CLEVR-style scenes, answered in `\\boxed{}`.

Upstream's `clevr_complex` and `clevr_cogen_a_train` (atroposlib 0.4.0's "multimodal DPO"
family) in one env. Scenes and questions are generated from a seed (`clevr_scene`): "How many
red things are left of the large cube?", "Is there anything else that is the same colour as the
small cylinder?", with the answer computed from the scene graph. The answer goes in `\\boxed{}`
as upstream asked (`--env.answer_format tags` for `<answer>`); numbers compare numerically
(`two` is 2), yes/no and attribute words up to case, with CLEVR's synonyms (`ball` for sphere,
`shiny` for metal). +1 right, else -1. The hub's CLEVR sets read with `--env.dataset_name
MMInstruction/Clevr_CoGenT_TrainA_70K_Complex` (or `leonardPKU/clevr_cogen_a_train`): their
`image`, `problem` and `solution` (tags around it are taken off). docs/multimodal.md.

>>> env_config = ClevrConfig(families="count")
>>> item = Clevr.generated_item(env_config, 3)
>>> item["id"], item["category"], item["question"].startswith("How many")
('clevr-3', 'count', True)
>>> Clevr.wrong_answer({"answer": "metal"}), Clevr.wrong_answer({"answer": "2"})
('rubber', '3')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, field_validator

from atropos.environments.common.selection import named_subset
from atropos.environments.multimodal.answers import AnswerStyle
from atropos.environments.multimodal.base import VisionConfig, VisionEnv
from atropos.environments.multimodal.clevr_scene import (
    FAMILIES,
    MAX_OBJECTS,
    VALUES,
    Scene,
    ask,
    make_scene,
    render,
)

__all__ = ["Clevr", "ClevrConfig"]

SYNONYMS: dict[str, str] = {
    "ball": "sphere",
    "balls": "sphere",
    "spheres": "sphere",
    "block": "cube",
    "blocks": "cube",
    "cubes": "cube",
    "cylinders": "cylinder",
    "big": "large",
    "tiny": "small",
    "metallic": "metal",
    "shiny": "metal",
    "matte": "rubber",
    "grey": "gray",
}
_TAGS = re.compile(r"</?answer>", re.IGNORECASE)


class ClevrConfig(VisionConfig):
    """`clevr`'s settings."""

    answer_format: AnswerStyle = Field(
        default="boxed", description="how to answer: boxed (\\boxed{}, upstream's), tags or either"
    )
    max_objects: int = Field(
        default=8, ge=3, le=MAX_OBJECTS, description="objects per scene, at most"
    )
    families: str = Field(
        default=",".join(FAMILIES),
        description="question families to draw from: count, exist, relate, compare, query, same",
    )
    eval_split: str = Field(
        default="train",
        description="hub split to evaluate on (train: the rows after the training rows)",
    )

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: str) -> str:
        return ",".join(named_subset(value, FAMILIES, "family"))


class Clevr(VisionEnv[ClevrConfig]):
    """Answer a question about a CLEVR-style scene; +1 right, else -1."""

    name = "clevr"
    kind = "clevr"
    task = "You answer questions about a scene of solid objects."
    example = "2"
    synonyms: ClassVar[Mapping[str, str]] = SYNONYMS
    hub_fields = ("image", "problem", "solution")

    @classmethod
    def make_item(cls, config: ClevrConfig, seed: int) -> dict[str, Any]:
        scene = make_scene(seed, config.max_objects)
        question = ask(scene, seed, tuple(config.families.split(",")))
        return {
            "question": question.text,
            "answer": question.answer,
            "category": question.family,
            "scene": scene.as_json(),
        }

    @classmethod
    def draw(cls, item: Mapping[str, Any]) -> Any:
        return render(Scene.from_json(item["scene"]))

    def hub_item(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        if row["image"] is None or not row["problem"] or not row["solution"]:
            return []
        gold = _TAGS.sub("", str(row["solution"])).strip()
        return [
            {
                "question": str(row["problem"]),
                "answer": gold,
                "category": "hub",
                "image": row["image"],
            }
        ]

    @classmethod
    def wrong_answer(cls, item: Mapping[str, Any]) -> str:
        """Another value of the same attribute for an attribute answer, else the default."""
        gold = str(item["answer"])
        for values in VALUES.values():
            if gold in values:
                return next(v for v in values if v != gold)
        return super().wrong_answer(item)
