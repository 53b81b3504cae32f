"""Sequences as conversations: from messages, from tokens split by the masks (not a text prefix)."""

from __future__ import annotations

import pytest

from atropos.export.render import (
    Conversation,
    conversation,
    from_tokens,
    parse_transcript,
    shared_prompt,
    split_by_mask,
)
from atropos.export.source import Group

from .conftest import QUESTION, chat_group, encode_chat


def as_group(raw: dict) -> Group:
    return Group(**raw)


class TestMaskSplit:
    def test_a_prompt_that_recurs_in_the_completion(self, tok):
        # upstream's str.split(prefix)[1] cut the completion at the prefix's second occurrence
        prompt = tok.encode("Say: echo echo", add_special_tokens=False)
        completion = tok.encode("Say: echo echo, then Say: echo echo", add_special_tokens=False)
        tokens = prompt + prompt + completion  # the prompt itself repeats too
        mask = [-100] * (2 * len(prompt)) + completion
        head, tail = split_by_mask(tokens, mask)
        assert tok.decode(head) == "Say: echo echoSay: echo echo"
        assert tok.decode(tail) == "Say: echo echo, then Say: echo echo"

    def test_an_empty_prompt(self, tok):
        ids = tok.encode("all trained", add_special_tokens=False)
        assert split_by_mask(ids, ids) == ([], ids)
        conv = from_tokens(ids, ids, tok)
        assert conv == Conversation([{"role": "assistant", "content": "all trained"}], 0)

    def test_nothing_trained_is_an_error(self):
        with pytest.raises(ValueError, match="no trained position"):
            split_by_mask([1, 2], [-100, -100])

    def test_a_group_of_one_keeps_its_completion(self, tok):
        # upstream's common prefix of one text is the whole text: an empty completion
        raw = chat_group(tok, ["4"], [1.0], messages=False)
        conv = conversation(as_group(raw), 0, lambda: tok)
        assert isinstance(conv, Conversation)
        assert conv.messages[conv.prompt_len :] == [{"role": "assistant", "content": "4"}]

    def test_cut_in_the_middle_of_a_message_keeps_it_in_the_completion(self, tok):
        tokens, mask = encode_chat(tok, QUESTION, "<think>ok</think> 4")
        think = len(tok.encode("<think>", add_special_tokens=False))
        start = next(j for j, m in enumerate(mask) if m != -100)
        mask = [-100] * (start + think) + tokens[start + think :]  # "<think>" was prefilled
        conv = from_tokens(tokens, mask, tok)
        assert conv.prompt_len == 2
        assert conv.messages[2] == {"role": "assistant", "content": "<think>ok</think> 4"}


class TestFromTokens:
    def test_chatml_is_parsed_back_into_messages(self, tok):
        raw = chat_group(tok, ["What is 2+2? It is 4."], [1.0], messages=False)
        conv = conversation(as_group(raw), 0, lambda: tok)
        assert conv == Conversation(
            [*QUESTION, {"role": "assistant", "content": "What is 2+2? It is 4."}], 2
        )

    def test_messages_and_tokens_agree(self, tok):
        raw = chat_group(tok, ["It is 4."], [1.0])
        from_messages = conversation(as_group(raw), 0, None)
        raw["messages"] = None
        decoded = conversation(as_group(raw), 0, lambda: tok)
        assert isinstance(from_messages, Conversation) and isinstance(decoded, Conversation)
        assert from_messages.messages == decoded.messages
        assert from_messages.prompt_len is None and decoded.prompt_len == 2

    def test_multi_turn_completion_with_an_untrained_tool_reply(self, tok):
        chat = [
            *QUESTION,
            {"role": "assistant", "content": "calc(2+2)"},
            {"role": "tool", "content": "4"},
            {"role": "assistant", "content": "It is 4."},
        ]
        text = tok.apply_chat_template(chat, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        prompt = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
        n = len(tok.encode(prompt, add_special_tokens=False))
        conv = from_tokens(ids, [-100] * n + ids[n:], tok)
        assert conv.messages == chat and conv.prompt_len == 2

    def test_text_without_a_template(self, tok):
        ids = tok.encode("Q: 2+2? A: 4", add_special_tokens=False)
        n = len(tok.encode("Q: 2+2? A:", add_special_tokens=False))
        conv = from_tokens(ids, [-100] * n + ids[n:], tok)
        assert conv.messages == [
            {"role": "user", "content": "Q: 2+2? A:"},
            {"role": "assistant", "content": " 4"},
        ]

    def test_llama3_transcripts(self):
        text = (
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
        )
        blocks = parse_transcript(text, ["<|begin_of_text|>"])
        assert [m for m, _ in blocks or []] == [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
        ]


class TestConversation:
    def test_messages_win_over_tokens(self, tok):
        raw = chat_group(tok, ["4"], [1.0])
        raw["messages"][0][-1]["content"] = "from messages"
        conv = conversation(as_group(raw), 0, lambda: tok)
        assert isinstance(conv, Conversation) and conv.messages[-1]["content"] == "from messages"

    def test_the_tokenizer_is_only_loaded_when_needed(self, tok):
        calls = []

        def load():
            calls.append(1)
            return tok

        conversation(as_group(chat_group(tok, ["4"], [1.0])), 0, load)
        assert calls == []
        conversation(as_group(chat_group(tok, ["4"], [1.0], messages=False)), 0, load)
        assert calls == [1]

    def test_no_messages_and_no_tokenizer(self, tok):
        raw = chat_group(tok, ["4"], [1.0], messages=False)
        assert conversation(as_group(raw), 0, None) == "no_messages"

    def test_nothing_trained(self, tok):
        raw = chat_group(tok, ["4"], [1.0], messages=False)
        raw["masks"] = [[-100] * len(raw["tokens"][0])]
        assert conversation(as_group(raw), 0, lambda: tok) == "nothing_trained"

    def test_undecodable_tokens(self, tok):
        group = Group(tokens=[[1, -5]], masks=[[-100, 7]], scores=[1.0])
        assert conversation(group, 0, lambda: tok) == "undecodable"

    def test_whole_transcript_in_one_message_is_parsed(self, tok):
        # what `--env.include_messages` writes for groups without messages
        raw = chat_group(tok, ["It is 4."], [1.0], messages=False)
        raw["messages"] = [[{"role": "user", "content": tok.decode(raw["tokens"][0])}]]
        conv = conversation(as_group(raw), 0, None)
        assert isinstance(conv, Conversation)
        assert conv.messages == [*QUESTION, {"role": "assistant", "content": "It is 4."}]
        # and with a tokenizer the tokens are used, split by the mask
        assert conversation(as_group(raw), 0, lambda: tok) == Conversation(conv.messages, 2)

    def test_messages_without_an_answer(self, tok):
        raw = chat_group(tok, ["4"], [1.0])
        raw["messages"] = [QUESTION]
        assert conversation(as_group(raw), 0, None) == "no_assistant_message"

    def test_invalid_or_missing_message_rows(self, tok):
        raw = chat_group(tok, ["4", "5"], [1.0, 0.0])
        raw["messages"] = [[{"content": "no role"}]]  # bad row 0, no row 1
        assert conversation(as_group(raw), 0, None) == "no_messages"
        assert conversation(as_group(raw), 1, None) == "no_messages"
        assert isinstance(conversation(as_group(raw), 1, lambda: tok), Conversation)


class TestSharedPrompt:
    u = {"role": "user", "content": "q"}

    @staticmethod
    def ans(text: str) -> dict:
        return {"role": "assistant", "content": text}

    def test_mask_fixed_prompts_are_compared(self):
        a = Conversation([self.u, self.ans("x")], 1)
        b = Conversation([self.u, self.ans("y")], 1)
        assert shared_prompt(a, b) == 1
        c = Conversation([{"role": "user", "content": "other"}, self.ans("y")], 1)
        assert shared_prompt(a, c) is None

    def test_multi_turn_rollouts_split_at_the_first_divergent_answer(self):
        tool = {"role": "tool", "content": "r"}
        a = Conversation([self.u, self.ans("call a"), tool, self.ans("x")])
        b = Conversation([self.u, self.ans("call b"), tool, self.ans("y")])
        assert shared_prompt(a, b) == 1
        same_first = Conversation([self.u, self.ans("call a"), tool, self.ans("y")])
        assert shared_prompt(a, same_first) == 3

    def test_an_empty_prompt(self):
        a, b = Conversation([self.ans("x")]), Conversation([self.ans("y")])
        assert shared_prompt(a, b) == 0
