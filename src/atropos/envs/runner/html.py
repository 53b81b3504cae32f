"""The page `process` leaves beside its JSONL: `atropos.view`'s self-contained rollout page.

Model text reaches the page only as escaped JSON shown through `textContent`, so a completion
holding `<script>` shows as text (see `atropos.view`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atropos.view import write_page


def write_html(jsonl: Path, tokenizer: Any = None, tokenizer_name: str | None = None) -> Path:
    """Render `jsonl` to `<same stem>.html` beside it; return the page's path.

    With `tokenizer` (a transformers tokenizer; process mode passes the run's, named
    `tokenizer_name`) the page also highlights the trained tokens. Bad lines are counted on the
    page, never raised.
    """
    jsonl = Path(jsonl)
    return write_page(
        [jsonl],
        jsonl.with_suffix(".html"),
        title=jsonl.stem,
        tokenizer=tokenizer,
        tokenizer_name=tokenizer_name,
    )
