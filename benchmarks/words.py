"""Tokens by word (`atropos.inference.words.WordCodec`) against the Rust `encode`, side by side.

For the shipped tokenizer and for two byte-level BPE tokenizers trained here on the
repository's docs and code (`atropos.testing.bpe`: GPT-2's `ByteLevel` regex, and Llama 3's
`Split` pattern before a bytes-only `ByteLevel`, the shape of Qwen's; `--vocab` ids each, a
few seconds to train): the
CPU per call of `Tokenizer.encode(text, add_special_tokens=False).ids` and of
`WordCodec.encode(text)` on a short user message, an assistant answer, and a long document
(README.md; cold: a new cache, each word's ids asked of the model once; warm: all in the cache),
the best of `--repeat` runs of each. Every text's ids are checked equal both ways first.

    python benchmarks/words.py --json benchmarks/results/words.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tokenizers import Tokenizer  # noqa: E402

from atropos.inference.tokenizer import TokenCodec, load_tokenizer  # noqa: E402
from atropos.inference.words import WordCodec  # noqa: E402
from atropos.testing.bpe import SHAPES, trained  # noqa: E402

CORPUS = sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("src/atropos/**/*.py")])
SHORT = "user\nRun the tests again, and fix the failing one in src/app.py: {i}"
ANSWER = "assistant\nThe test failed because the function returns None when the list is empty {i}."


def best_us(call: Callable[[int], Any], calls: int, repeat: int) -> float:
    """The least CPU time per call over `repeat` runs of `calls` calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for i in range(calls):
            call(i)
        best = min(best, (time.process_time() - t0) / calls * 1e6)
    return best


def measure(name: str, tok: Tokenizer, repeat: int) -> list[dict[str, Any]]:
    words = WordCodec.of(tok, json.loads(tok.to_str()))
    if words is None:
        raise SystemExit(f"{name}: no WordCodec for this tokenizer")
    doc = (ROOT / "README.md").read_text()
    assert doc.isascii(), "README.md is ASCII"

    def rust(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    for i in range(50):  # checked equal first
        for text in (SHORT.format(i=i), ANSWER.format(i=i)):
            assert words.encode(text) == rust(text), text
    assert words.encode(doc) == rust(doc)
    rows = []
    for label, template, calls in (("short message", SHORT, 2000), ("answer", ANSWER, 2000)):
        texts = [template.format(i=i % 64) for i in range(calls)]
        rows.append(
            {
                "tokenizer": name,
                "text": label,
                "chars": len(texts[0]),
                "rust_us": best_us(lambda i, t=texts: rust(t[i]), calls, repeat),
                "words_us": best_us(lambda i, t=texts: words.encode(t[i]), calls, repeat),
            }
        )

    def cold(i: int) -> None:
        words._cache.clear()
        words.encode(doc)

    doc_rust = best_us(lambda i: rust(doc), 3, repeat)
    rows.append(
        {
            "tokenizer": name,
            "text": "README.md, cold",
            "chars": len(doc),
            "rust_us": doc_rust,
            "words_us": best_us(cold, 3, repeat),
        }
    )
    words.encode(doc)
    rows.append(
        {
            "tokenizer": name,
            "text": "README.md, warm",
            "chars": len(doc),
            "rust_us": doc_rust,
            "words_us": best_us(lambda i: words.encode(doc), 3, repeat),
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=32000, help="ids of the trained tokenizers")
    p.add_argument("--repeat", type=int, default=7, help="runs of each measure (best kept)")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    backend = TokenCodec.of(load_tokenizer("tiny"))._backend
    shipped: list[tuple[str, Callable[[], Tokenizer]]] = [("shipped tiny", lambda: backend)]
    trained_ones: list[tuple[str, Callable[[], Tokenizer]]] = [
        (
            f"{shape} shape, {args.vocab} ids",
            lambda shape=shape: trained(shape, vocab=args.vocab, files=CORPUS),
        )
        for shape in SHAPES
    ]
    rows = []
    print("| tokenizer | text | chars | Rust encode us | by word us | Rust / by word |")
    print("|---|---|---:|---:|---:|---:|")
    for name, make in shipped + trained_ones:
        print(f"[words] {name}: ...", file=sys.stderr, flush=True)
        for row in measure(name, make(), args.repeat):
            rows.append(row)
            ratio = row["rust_us"] / row["words_us"]
            print(
                f"| {row['tokenizer']} | {row['text']} | {row['chars']} | {row['rust_us']:.1f}"
                f" | {row['words_us']:.1f} | {ratio:.1f}x |",
                flush=True,
            )
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
