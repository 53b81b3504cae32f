#!/usr/bin/env python3
"""Regenerate the tiny tokenizer shipped in src/atropos/tiny/tokenizer/ (deterministic).

A byte-level BPE (about 1,000 tokens) trained with the `tokenizers` library on a corpus this
script generates from a fixed seed: English-ish words, numbers, punctuation, code and newlines.
It carries ChatML special tokens and a chat template, so it loads offline with
`transformers.AutoTokenizer.from_pretrained(dir)` and `apply_chat_template` works.

Usage: python scripts/make_tiny_tokenizer.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "src" / "atropos" / "tiny" / "tokenizer"
SEED = 20260101
VOCAB_SIZE = 1024
LINES = 6000

# Special tokens come first, so their ids are 0..3 in every regeneration.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# Plain added tokens (not special: they survive skip_special_tokens), appended after training.
EXTRA = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late
run while press close night real life few north open seem together next white children begin
got walk example ease paper group always music those both mark often letter until mile river
car feet care second book carry took science eat room friend began idea fish mountain stop
once base hear horse cut sure watch color face wood main enough plain girl usual young ready
above ever red list though feel talk bird soon body dog family direct pose leave song measure
door product black short numeral class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice
voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring
yes distant fill east paint language among system user assistant tool reward score answer
solve step math total sum result because therefore compute value function return print
""".split()

PUNCT = [".", ".", ".", ",", ",", "!", "?", ";", ":"]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n    print(i)\n",
    'data = {"name": "atropos", "steps": 3}\n',
    "if total > 100:\n    total = total - 1\n",
    "x = [1, 2, 3]\ny = sum(x) / len(x)\n",
    "while n != 0:\n    n = n // 2\n",
]


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        return str(rng.randint(0, 99))
    if kind < 0.8:
        return str(rng.randint(100, 99999))
    return f"{rng.randint(0, 999)}.{rng.randint(0, 99):02d}"


def _sentence(rng: random.Random) -> str:
    words = []
    for _ in range(rng.randint(4, 14)):
        words.append(_number(rng) if rng.random() < 0.12 else rng.choice(WORDS))
    text = " ".join(words)
    text = text[0].upper() + text[1:]
    if rng.random() < 0.15:
        text = f'"{text}"'
    elif rng.random() < 0.1:
        text = f"({text})"
    return text + rng.choice(PUNCT)


def _line(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.08:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return f"What is {a} {op} {b}? The answer is {value}.\n"
    if roll < 0.12:
        return rng.choice(CODE)
    if roll < 0.16:
        return f"Step {rng.randint(1, 9)}: " + _sentence(rng) + "\n"
    text = " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))
    return text + ("\n\n" if rng.random() < 0.2 else "\n")


def corpus(seed: int = SEED, lines: int = LINES) -> Iterator[str]:
    """The training text, one line (or short block) at a time; same seed, same text."""
    rng = random.Random(seed)
    for _ in range(lines):
        yield _line(rng)


CHAT_TEMPLATE = r"""
{%- macro text(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- elif content is iterable -%}
    {%- for part in content if part.type == 'text' -%}{{- part.text -}}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages and messages[0].role == 'system' -%}
    {{- text(messages[0].content) + '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\nCall a tool with <tool_call>{"name": ..., "arguments": ...}</tool_call>.\n' -}}
  {%- for tool in tools -%}{{- tool | tojson + '\n' -}}{%- endfor -%}
  {{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if not (tools and loop.first and message.role == 'system') -%}
    {{- '<|im_start|>' + message.role + '\n' + text(message.content) -}}
    {%- if message.role == 'assistant' and message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {%- if text(message.content) or not loop.first -%}{{- '\n' -}}{%- endif -%}
        {%- set args = fn.arguments if fn.arguments is string else fn.arguments | tojson -%}
        {{- '<tool_call>{"name": "' + fn.name + '", "arguments": ' + args + '}</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()


def train() -> Tokenizer:
    """Train the byte-level BPE on the generated corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer, length=LINES)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in EXTRA])
    return tok


def tokenizer_config() -> dict[str, object]:
    """The transformers side: special-token roles and the chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|pad|>",
        "unk_token": None,
        "additional_special_tokens": ["<|endoftext|>", "<|im_start|>"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "padding_side": "right",
        "chat_template": CHAT_TEMPLATE,
    }


def build(out: Path) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    tok = train()
    files = [out / "tokenizer.json", out / "tokenizer_config.json", out / "special_tokens_map.json"]
    files[0].write_text(tok.to_str(pretty=True) + "\n")
    config = tokenizer_config()
    files[1].write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special = {k: config[k] for k in ("eos_token", "pad_token", "additional_special_tokens")}
    files[2].write_text(json.dumps(special, indent=2) + "\n")
    return files


def main() -> int:
    """Command-line entry: regenerate into --out (default: the shipped directory)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    args = parser.parse_args()
    for path in build(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
