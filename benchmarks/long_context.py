"""Long first messages for the proxy benchmarks (`--context N`): about N tokens of ASCII text
(the repo's README, repeated), as an agent's prompt holding files and tool output does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def context_text(tokenizer: Any, tokens: int) -> str:
    """About `tokens` tokens of text by `tokenizer` ("" for 0), starting with a newline."""
    if tokens <= 0:
        return ""
    text = "\n" + (ROOT / "README.md").read_text(encoding="ascii", errors="ignore")
    per = len(tokenizer.encode(text, add_special_tokens=False)) or 1
    copies = tokens // per + 1
    whole = text * copies
    return whole[: int(len(whole) * tokens / (per * copies))]
