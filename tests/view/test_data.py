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


def _chat(*turns):
    return [{"role": r, "content": c} for r, c in turns]


def test_previews_show_the_prompt_and_the_best_answer_on_one_line():
    system = ("system", "Be brief.")
    g = {
        "tokens": [[1], [2], [3]],
        "masks": [[1], [2], [3]],
        "scores": [0.5, 1.0, float("nan")],
        "messages": [
            _chat(system, ("user", "What is\n2 + 2?"), ("assistant", "five")),
            _chat(system, ("user", "What is\n2 + 2?"), ("assistant", "<b>4</b>\n\n  because")),
            _chat(system, ("user", "What is\n2 + 2?"), ("assistant", "x" * 500)),
        ],
    }
    group = data_of(g)["groups"][0]
    assert group["best"] == 1  # NaN is no score
    assert group["prompt_preview"] == "What is 2 + 2?"
    assert group["answer_preview"] == "<b>4</b> because"  # data: the page shows it as text
    assert group["shared"] == 2  # system + user, once; each sequence keeps its answer
    assert [len(s["messages"]) for s in group["seqs"]] == [3, 3, 3]  # the data stays whole

    g["scores"] = [float("nan")] * 3  # no score: the first sequence stands in
    group = data_of(g)["groups"][0]
    assert group["best"] is None and group["answer_preview"] == "five"
    g["scores"] = [0.0, 0.0, 2.0]
    long = data_of(g)["groups"][0]["answer_preview"]
    assert len(long) == 200 and long.endswith("…")


def test_the_shared_prompt_is_the_common_start_and_leaves_each_sequence_its_own_part():
    def shared(*convs, scores=None):
        n = len(convs)
        g = {"tokens": [[1]] * n, "masks": [[1]] * n, "scores": scores or [0.0] * n}
        g["messages"] = list(convs)
        return data_of(g)["groups"][0]["shared"]

    q, a, b = ("user", "q"), ("assistant", "a"), ("assistant", "b")
    assert shared(_chat(q, a), _chat(q, b)) == 1
    assert shared(_chat(q, a), _chat(q, a)) == 1  # identical: the answer still shows per sequence
    assert shared(_chat(q, a, q, b), _chat(q, a, q, a)) == 3  # multi-turn: up to where they part
    assert shared(_chat(q, a), _chat(("user", "other"), a)) == 0  # different prompts
    assert shared(_chat(q, a)) == 0  # one sequence: nothing to share
    assert shared(_chat(q, a), None) == 0  # a sequence without messages
    assert shared(_chat(q), _chat(q)) == 0  # one message each: it is each one's own part


def test_previews_are_none_without_messages_or_without_those_roles():
    bare = data_of({"tokens": [[1]], "masks": [[1]], "scores": [1.0]})["groups"][0]
    assert (bare["prompt_preview"], bare["answer_preview"], bare["shared"]) == (None, None, 0)
    g = {"messages": [_chat(("system", "s"), ("tool", "t"))], "scores": [1.0]}
    group = data_of(g)["groups"][0]
    assert (group["prompt_preview"], group["answer_preview"]) == (None, None)
