"""The page: model text cannot break out of the data, the page is self-contained."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from atropos.envs.runner.html import write_html
from atropos.view import build_page, read_files
from atropos.view.page import DATA_ID, embed_json

from .conftest import INJECTIONS, chat_group, page_json, write_jsonl


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text of script elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def parse(page: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Elements()
    p.feed(page)
    p.close()
    return p.tags


def injected_page(tmp_path, tiny=None, title="<script>t</script>"):
    rows = [
        chat_group(tiny, INJECTIONS, [1.0, 0.0, -1.0, 0.5], group_id="</script>")
        if tiny is not None
        else {
            "tokens": [[1, 2]] * len(INJECTIONS),
            "masks": [[-100, 2]] * len(INJECTIONS),
            "scores": [0.0] * len(INJECTIONS),
            "messages": [[{"role": "<b>r</b>", "content": c}] for c in INJECTIONS],
            "images": ["javascript:alert(1)", "https://evil.example/a.png"],
        }
    ]
    path = write_jsonl(tmp_path / "x.jsonl", rows)
    return build_page(read_files([path]), title, tiny, "tiny" if tiny else None)


def _check_contained(page: str) -> None:
    tags = parse(page)
    scripts = [attrs for tag, attrs in tags if tag == "script"]
    assert len(scripts) == 2
    assert scripts[0] == {"type": "application/json", "id": DATA_ID}
    assert set(scripts[1]) == {"nonce"}
    assert not [t for t, _ in tags if t in ("img", "iframe", "object", "embed", "link", "base")]
    assert not [a for _, attrs in tags for a in attrs if a.startswith("on")]  # no handlers
    # the raw data holds no markup at all: every <, > and & is a \u escape
    start = page.index(f"id='{DATA_ID}'>") + len(f"id='{DATA_ID}'>")
    raw = page[start : page.index("</script>", start)]
    for ch in "<>&\u2028\u2029":
        assert ch not in raw
    # and the whole page holds the injected tags nowhere unescaped
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "<img" not in page and "<b>" not in page and "<!--" not in page


def test_injected_markup_stays_text_without_a_tokenizer(tmp_path):
    page = injected_page(tmp_path)
    _check_contained(page)
    data = page_json(page)
    msgs = [s["messages"][0] for s in data["groups"][0]["seqs"]]
    assert [m["content"] for m in msgs] == INJECTIONS  # the text itself comes back intact
    assert msgs[0]["role"] == "<b>r</b>"
    assert data["groups"][0]["images"] == []
    assert "&lt;script&gt;t&lt;/script&gt;" in page  # the title is HTML-escaped


def test_injected_markup_stays_text_in_token_pieces(tmp_path, tiny):
    page = injected_page(tmp_path, tiny)
    _check_contained(page)
    seqs = page_json(page)["groups"][0]["seqs"]
    assert all(inj in "".join(s["pieces"]) for s, inj in zip(seqs, INJECTIONS, strict=True))


def test_the_page_loads_nothing_and_allows_only_its_own_script(tmp_path):
    page = injected_page(tmp_path)
    csp = re.search(r"Content-Security-Policy' content=\"([^\"]+)\"", page).group(1)
    nonce = re.search(r"<script nonce='([^']+)'>", page).group(1)
    assert "default-src 'none'" in csp and "img-src data:" in csp
    assert f"script-src 'nonce-{nonce}'" in csp
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)  # nothing remote
    assert ".innerHTML" not in page and "insertAdjacentHTML" not in page  # DOM by textContent
    assert nonce != re.search(r"<script nonce='([^']+)'>", injected_page(tmp_path)).group(1)


def test_embed_json_round_trips_every_character():
    import json

    value = {"s": "".join(chr(c) for c in range(0, 0x3000, 7)) + "\u2028\u2029</script>"}
    assert json.loads(embed_json(value)) == value


def test_process_mode_page_is_the_viewer_and_never_raises_on_bad_lines(tmp_path, tiny):
    path = write_jsonl(
        tmp_path / "run.jsonl",
        [chat_group(tiny, ["<b>1</b>", "2"], [1.0, 0.0]), "{broken", {"x": 1}],
    )
    out = write_html(path)
    assert out == tmp_path / "run.html"
    page = out.read_text()
    _check_contained(page)
    data = page_json(page)
    assert data["bad"] == 2 and len(data["groups"]) == 1
    assert data["groups"][0]["seqs"][0]["pieces"] is None  # no tokenizer: messages only
    page = write_html(path, tokenizer=tiny).read_text()
    assert page_json(page)["groups"][0]["seqs"][0]["pieces"]
