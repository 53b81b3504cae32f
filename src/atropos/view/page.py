"""The HTML page: one self-contained file (inline CSS and JS, no network, works from file://).

The data travels as JSON in `<script type="application/json">`, with `<`, `>`, `&` and the
line separators U+2028/U+2029 written as `\\u` escapes, so no text inside it can close the
script element or open another; the page's script builds the DOM with `textContent` only.
A Content-Security-Policy allows only the page's own script (by nonce), inline styles and
`data:` images: even a tag that slipped through could neither run nor load anything.

>>> embed_json({"text": "</script><script>alert(1)</script>"})
'{"text":"\\\\u003c/script\\\\u003e\\\\u003cscript\\\\u003ealert(1)\\\\u003c/script\\\\u003e"}'
"""

from __future__ import annotations

import html
import json
import secrets
from importlib import resources
from typing import Any

DATA_ID = "atropos-data"
"""The id of the JSON data element."""

_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def embed_json(value: Any) -> str:
    """`value` as JSON that is safe inside a `<script>` element of an HTML page."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_ESCAPES)


def asset(name: str) -> str:
    """The text of `static/<name>` (the page's CSS and JS)."""
    return (resources.files("atropos.view") / "static" / name).read_text(encoding="utf-8")


def render(data: dict[str, Any]) -> str:
    """The page for `data` (see `atropos.view.data.page_data`)."""
    nonce = secrets.token_urlsafe(18)
    title = html.escape(str(data.get("title", "rollouts")))
    csp = (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline';"
        f" script-src 'nonce-{nonce}'; base-uri 'none'; form-action 'none'"
    )
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{title}</title><style>{asset('view.css')}</style></head>\n<body>"
        f"<header><h1>{title}</h1><p id='overview'></p><div id='banners'></div>"
        "<div id='controls'>"
        "<input id='q' type='search' placeholder='search text (/)' aria-label='search'>"
        "<label>score <input id='smin' type='number' step='any' placeholder='min'"
        " aria-label='minimum group mean score'></label>"
        "<label>to <input id='smax' type='number' step='any' placeholder='max'"
        " aria-label='maximum group mean score'></label>"
        "<label>env <select id='env'><option value=''>all</option></select></label>"
        "<label id='finish-label' hidden>finish <select id='finish'>"
        "<option value=''>all</option></select></label>"
        "<label id='ovr-label' hidden><input id='ovr' type='checkbox'> with overrides</label>"
        "<label>sort <select id='sort'>"
        "<option value='order'>file order</option>"
        "<option value='mean-desc'>mean score, high first</option>"
        "<option value='mean-asc'>mean score, low first</option>"
        "<option value='max-desc'>max score, high first</option>"
        "<option value='spread-desc'>spread (max - min), wide first</option>"
        "</select></label>"
        "<span id='count' aria-live='polite'></span>"
        "</div><p class='keys'>keys: <kbd>/</kbd> search, <kbd>j</kbd>/<kbd>k</kbd> next/previous"
        " group, <kbd>o</kbd> open/close</p></header>\n"
        "<main id='groups'><noscript>This page needs JavaScript to show its rollouts.</noscript>"
        "</main>\n"
        f"<script type='application/json' id='{DATA_ID}'>{embed_json(data)}</script>\n"
        f"<script nonce='{nonce}'>{asset('view.js')}</script>\n"
        "</body></html>\n"
    )
