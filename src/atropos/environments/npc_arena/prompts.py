"""What the NPC (the policy) and the judge read, and how per-criterion verdicts are parsed.

The policy's system prompt is the whole character sheet plus the retrieved lore under a
"World knowledge" heading. The judge sees the same sheet and lore, the player's line and the
response(s), and is asked for one line per criterion (pairwise: `consistency: A`; rubric:
`consistency: 7`) and, pairwise, an overall `\\boxed{A}` or `\\boxed{B}`.

>>> criterion_choices("hmm\\nConsistency: B\\n- lore accuracy: A or B\\nengagingness: **A**")
{'consistency': 'B', 'engagingness': 'A'}
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from atropos.environments.common.retrieval import LoreDoc
from atropos.environments.npc_arena.characters import CharacterSheet, render_sheet
from atropos.envs.types import Message

__all__ = [
    "CRITERIA",
    "JUDGE_SYSTEM",
    "criterion_choices",
    "pair_messages",
    "policy_messages",
    "rubric_messages",
]

CRITERIA = ("consistency", "lore_accuracy", "engagingness")
WORLD_HEADING = "## World knowledge"
JUDGE_SYSTEM = """You are a game master reviewing lines written for a non-player character \
(NPC) of a role-playing game. Judge them on three criteria:
- consistency: in character; fits the sheet's personality, speech style, backstory and \
knowledge, and never does what the sheet forbids (breaking character included);
- lore_accuracy: agrees with the world knowledge and the sheet, inventing nothing that \
contradicts them;
- engagingness: answers the player and makes them want to keep playing.
Think it over first if you like (inside <think> </think> tags), then end exactly in the format \
asked for."""
PAIR_ASK = """Which response is the better line for this character? End with one line per \
criterion naming the better response, then your overall choice:
consistency: A or B
lore_accuracy: A or B
engagingness: A or B
\\boxed{A} or \\boxed{B}"""
RUBRIC_ASK = """Rate the response on each criterion from {low} (worst) to {high} (best). End \
with one line per criterion:
consistency: N
lore_accuracy: N
engagingness: N"""


def world_knowledge(lore: Sequence[LoreDoc]) -> str:
    """The lore as prompt lines ("(none)" without any)."""
    return "\n".join(doc.line() for doc in lore) or "(none)"


def policy_messages(sheet: CharacterSheet, lore: Sequence[LoreDoc], line: str) -> list[Message]:
    """The conversation the NPC completes: its sheet and the lore, then the player's line."""
    parts = [
        sheet.system_prompt,
        f"Personality: {sheet.personality}",
        f"Speech style: {sheet.speech_style}",
        f"Backstory: {sheet.backstory}",
        "What you know:\n" + "\n".join(f"- {fact}" for fact in sheet.knowledge),
        "Never:\n" + "\n".join(f"- {rule}" for rule in sheet.forbidden),
        "Answer the player in character, in a few sentences.",
    ]
    if lore:
        parts.append(f"{WORLD_HEADING}\n{world_knowledge(lore)}")
    return [{"role": "system", "content": "\n\n".join(parts)}, {"role": "user", "content": line}]


def _context(sheet: CharacterSheet, lore: Sequence[LoreDoc], line: str) -> str:
    return (
        f"[Character sheet]\n{render_sheet(sheet)}\n\n[World knowledge]\n{world_knowledge(lore)}"
        f"\n\n[Player]\n{line}"
    )


def pair_messages(
    sheet: CharacterSheet, lore: Sequence[LoreDoc], line: str, first: str, second: str
) -> list[Message]:
    """The judge's pairwise request: sheet, lore, player line, responses A and B."""
    text = f"{_context(sheet, lore, line)}\n\n[Response A]\n{first}\n\n[Response B]\n{second}"
    return [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": f"{text}\n\n{PAIR_ASK}"},
    ]


def rubric_messages(
    sheet: CharacterSheet,
    lore: Sequence[LoreDoc],
    line: str,
    response: str,
    low: int = 1,
    high: int = 10,
) -> list[Message]:
    """The judge's rubric request: sheet, lore, player line and one response to rate."""
    ask = RUBRIC_ASK.format(low=low, high=high)
    text = f"{_context(sheet, lore, line)}\n\n[Response]\n{response}\n\n{ask}"
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": text}]


def _choice_pattern(name: str) -> re.Pattern[str]:
    words = r"[\s_-]*".join(re.escape(w) for w in re.split(r"[\s_-]+", name))
    return re.compile(
        rf"(?m)^[^\n:=]*?\b(?i:{words})[\s*]*[:=][\s*]*(?:(?i:response)\s+)?([AB])\b"
        r"(?![ \t]*(?:or|/)[ \t]*[AB]\b)"
    )


_PATTERNS = {name: _choice_pattern(name) for name in CRITERIA}


def criterion_choices(text: str) -> dict[str, str]:
    """The response ("A" or "B") each criterion's line names (the last such line counts);
    criteria without a readable line are left out."""
    found: dict[str, str] = {}
    for name, pattern in _PATTERNS.items():
        picks = pattern.findall(text)
        if picks:
            found[name] = picks[-1]
    return found
