"""Token pieces and mask runs: the trained-token highlighting matches the masks."""

from __future__ import annotations

import random

from atropos.view.data import page_data
from atropos.view.read import Collection, Entry
from atropos.view.tokens import expand_runs, incremental_pieces, mask_runs, pieces

from .conftest import chat_group


def test_pieces_join_to_the_decoded_text_one_per_token(tiny):
    for text in ["plain ascii", "é ✓ 日本語 🙂", "<|im_start|>user\nhi<|im_end|>", "", " lead"]:
        ids = tiny.encode(text, add_special_tokens=False)
        got = pieces(tiny, ids)
        assert len(got) == len(ids)
        assert "".join(got) == tiny.decode(ids, skip_special_tokens=False) == text


def test_incremental_pieces_keep_spaces_a_lone_token_loses():
    # a SentencePiece-like decoder: "▁" is a space, except at the very start of the text
    vocab = {1: "▁Hello", 2: "▁world", 3: "!"}

    def decode(ids):
        return "".join(vocab[i] for i in ids).replace("▁", " ").lstrip(" ")

    assert incremental_pieces(decode, [1, 2, 3]) == ["Hello", " world", "!"]

    class Tok:  # no backend: the slow path, then the incremental redo
        def decode(self, ids, skip_special_tokens=False):
            return decode(ids)

    assert pieces(Tok(), [1, 2, 3]) == ["Hello", " world", "!"]


def test_partial_characters_go_to_the_token_that_completes_them():
    table = {1: b"a", 2: b"\xc3", 3: b"\xa9", 4: b"b"}  # \xc3\xa9 is é

    def decode(ids):
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    assert incremental_pieces(decode, [1, 2, 3, 4]) == ["a", "", "é", "b"]
    assert incremental_pieces(decode, [1, 2]) == ["a", "\ufffd"]  # cut off at the end


def test_mask_runs_round_trip():
    rng = random.Random(0)
    for _ in range(200):
        masks = [rng.choice([-100, 7]) for _ in range(rng.randrange(0, 12))]
        runs = mask_runs(masks)
        assert expand_runs(runs) == [m != -100 for m in masks]
    assert mask_runs([]) == [0]


def test_trained_spans_match_the_masks(tiny):
    answers = ["The answer is 4.", "é ✓ </script>", "```py\nprint(4)\n```"]
    group = chat_group(tiny, answers, [1.0, 0.0, 0.5])
    found = Collection(limit=10)
    found.add(Entry(group, "t.jsonl", "t.jsonl:1"))
    data = page_data(found, "t", tiny, "tiny")
    for seq, ids, masks, answer in zip(
        data["groups"][0]["seqs"], group["tokens"], group["masks"], answers, strict=True
    ):
        flags = expand_runs(seq["runs"])
        assert flags == [m != -100 for m in masks]
        trained_text = "".join(p for p, t in zip(seq["pieces"], flags, strict=True) if t)
        trained_ids = [i for i, m in zip(ids, masks, strict=True) if m != -100]
        assert trained_text == tiny.decode(trained_ids, skip_special_tokens=False)
        assert trained_text.startswith(answer)  # the completion (then its end token)
        prompt_text = "".join(p for p, t in zip(seq["pieces"], flags, strict=True) if not t)
        assert "What is 2 + 2?" in prompt_text and answer not in prompt_text
