"""What the page shows of a group: score statistics, messages, images, odd values."""

from __future__ import annotations

import base64
import math

from atropos.view.data import Budget, image_url, page_data
from atropos.view.read import Collection, Entry

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(32)).decode()


def data_of(*groups, tokenizer=None, budget=None):
    found = Collection(limit=100)
    for i, g in enumerate(groups):
        found.add(Entry(g, "t.jsonl", f"t.jsonl:{i + 1}"))
    return page_data(found, "t", tokenizer, "tiny" if tokenizer else None, budget)


def test_group_and_sequence_scores():
    data = data_of({"tokens": [[1], [2], [3]], "masks": [[1], [2], [3]], "scores": [1, -1, 0.5]})
    g = data["groups"][0]
    assert g["stats"] == {"min": -1.0, "mean": 0.5 / 3, "max": 1.0, "spread": 2.0}
    assert [s["score"] for s in g["seqs"]] == [1.0, -1.0, 0.5]
    assert [s["trained"] for s in g["seqs"]] == [1, 1, 1]


def test_non_finite_and_missing_values_become_null_and_the_page_data_is_strict_json():
    import json

    g = {
        "tokens": [[1, 2], [3]],
        "masks": [[-100, 2]],  # one row short
        "scores": [math.nan, 2.0],
        "overrides": [{"x": math.inf, "finish_reason": "length"}],
        "group_overrides": {"y": [math.nan]},
        "env_id": True,  # not an env id
    }
    data = data_of(g)
    json.dumps(data, allow_nan=False)  # would raise on NaN/inf
    group = data["groups"][0]
    assert group["stats"]["mean"] == 2.0 and group["seqs"][0]["score"] is None
    assert group["seqs"][0]["finish"] == "length" and group["seqs"][0]["overrides"]["x"] is None
    assert group["seqs"][1]["trained"] is None and group["env"] is None
    assert group["group_overrides"] == {"y": [None]}


def test_messages_are_normalised_with_parts_images_and_extra_keys():
    conversation = [
        {"role": "system", "content": None},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ],
        },
        {"role": "assistant", "content": "x", "tool_calls": [{"id": 1}]},
        "a bare string",
    ]
    data = data_of({"messages": [conversation], "scores": [1.0]})
    msgs = data["groups"][0]["seqs"][0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", ""]
    assert msgs[1]["content"] == "look" and msgs[1]["images"] == [f"data:image/png;base64,{PNG}"]
    assert msgs[2]["extra"] == '{"tool_calls": [{"id": 1}]}'
    assert msgs[3]["content"] == "a bare string"
    assert any("1 image not shown" in n for n in data["notes"])


def test_images_only_inline_and_only_raster():
    assert image_url(PNG) == f"data:image/png;base64,{PNG}"
    for bad in [
        "http://example.com/a.png",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "data:text/html;base64,PHNjcmlwdD4=",
        'data:image/png;base64,AAAA"><script>',
        base64.b64encode(b"just some text, no image here").decode(),
        None,
        42,
    ]:
        assert image_url(bad) is None, bad
    data = data_of({"tokens": [[1]], "scores": [1.0], "images": [PNG, [PNG], "https://x/y.png"]})
    assert len(data["groups"][0]["images"]) == 2


def test_without_a_tokenizer_the_page_says_highlighting_needs_one():
    data = data_of({"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0]})
    assert data["groups"][0]["seqs"][0]["pieces"] is None
    assert any("--tokenizer" in n for n in data["notes"])


def test_the_token_budget_leaves_later_sequences_without_pieces(tiny):
    g = {"tokens": [[5, 6, 7]] * 3, "masks": [[-100, 6, 7]] * 3, "scores": [0, 0, 0]}
    data = data_of(g, tokenizer=tiny, budget=Budget(tokens=7))
    assert [s["pieces"] is not None for s in data["groups"][0]["seqs"]] == [True, True, False]
    assert any("1 sequence without a token view" in n for n in data["notes"])


def test_ids_the_tokenizer_cannot_decode_give_no_token_view(tiny):
    data = data_of({"tokens": [[-5, 10**12]], "masks": [[1, 1]], "scores": [0]}, tokenizer=tiny)
    seq = data["groups"][0]["seqs"][0]
    assert seq["pieces"] is None and seq["pieces_error"]
