"""The supervised warm start: examples, a few reproducible steps, saving, evaluating."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from atropos.environments.arithmetic import make_item
from atropos.inference.tokenize import template_ids
from atropos.inference.tokenizer import import_transformers_quietly, load_tokenizer
from atropos.tiny.warmstart import (
    WarmStartConfig,
    encode_example,
    evaluate_policy,
    save_policy,
    train,
)

torch.set_num_threads(1)
transformers = import_transformers_quietly()
transformers.logging.disable_progress_bar()
ROOT = Path(__file__).resolve().parents[2]
TINY_RUN = WarmStartConfig(steps=3, batch_size=8, train_items=64)  # what the script flags below say
SHORT = dataclasses.replace(TINY_RUN, warmup=1, log_every=1)


def test_examples_train_only_the_answer_and_end_of_turn():
    tok = load_tokenizer("tiny")
    ids, labels = encode_example(tok, make_item(12, 7))
    prompt = template_ids(
        tok, [{"role": "user", "content": "What is 12 + 7?"}], add_generation_prompt=True
    )
    assert ids[: len(prompt)] == prompt and labels[: len(prompt)] == [-100] * len(prompt)
    trained = ids[len(prompt) :]
    assert labels[len(prompt) :] == trained and trained[-1] == tok.eos_token_id
    assert tok.decode(trained, skip_special_tokens=True) == "19"
    _, sloppy = encode_example(tok, make_item(12, 7), answer=20)
    assert tok.decode(sloppy[len(prompt) :], skip_special_tokens=True) == "20"


def test_a_short_run_is_reproducible_and_learns(tmp_path):
    lines: list[str] = []
    first = train(SHORT, log=lines.append)
    second = train(SHORT)
    other = train(dataclasses.replace(SHORT, seed=1))
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(first.model.norm.weight, other.model.norm.weight)
    assert len(lines) == 3 and lines[-1].startswith("step 3/3  loss ")
    losses = [float(line.split()[3]) for line in lines]
    assert losses[-1] < losses[0]


def test_saved_policies_load_and_evaluate(tmp_path):
    folder = save_policy(train(dataclasses.replace(SHORT, steps=1)), tmp_path / "p", SHORT)
    assert {"config.json", "model.safetensors", "tokenizer.json", "warmstart.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert load_tokenizer(str(folder)).chat_template
    metrics = evaluate_policy(folder, n_items=6, samples=2, batch_size=4)
    assert metrics["items"] == 6
    assert all(0.0 <= metrics[k] <= 1.0 for k in ("greedy_accuracy", "pass_rate", "pass_at_k"))


def test_the_script_builds_the_same_weights(tmp_path):
    expected = save_policy(train(TINY_RUN), tmp_path / "here")
    args = ["--steps", "3", "--batch-size", "8", "--train-items", "64", "--no-eval"]
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/make_tiny_policy.py"), "--out", str(tmp_path / "s")]
        + args,
        check=True,
        capture_output=True,
    )
    a = load_file(expected / "model.safetensors")
    b = load_file(tmp_path / "s" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
