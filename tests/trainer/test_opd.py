"""On-policy distillation end to end on the CPU: `atropos env process arithmetic` rolls out on
the tiny policy (`atropos local serve tiny`, in process) with a teacher on a second local
server (a tiny random model with the same tokenizer); the groups it writes carry the teacher's
top-k logprobs, equal to what the teacher server answers for those tokens; `atropos train
--loss opd` then trains 2 steps on them in each mode."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from atropos.api.app import create_app  # noqa: E402
from atropos.client import MissingTeacher  # noqa: E402
from atropos.envs import registry  # noqa: E402
from atropos.envs.cli import main  # noqa: E402
from atropos.local.engine import Engine  # noqa: E402
from atropos.local.server import LocalServer  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.testing.serve import local_tiny_server  # noqa: E402
from atropos.trainer.train import train  # noqa: E402

from .helpers import config, metrics, push_groups  # noqa: E402

TOP_K = 4


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path) -> Iterator[tuple[str, str]]:
    """(the student's server: the tiny policy, the teacher's: a tiny random model)."""
    engine = Engine(str(tiny_model_dir), device="cpu", max_model_len=1024).start()
    try:
        with local_tiny_server() as student:
            app = LocalServer(engine, served_model_name="teacher").app
            with serve_in_thread(app) as teacher:
                yield student, f"{teacher}/v1"
    finally:
        engine.close()


@pytest.fixture(scope="module")
def groups(
    servers: tuple[str, str], tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """Eight groups of two from `atropos env process arithmetic --teacher.* ...`."""
    student, teacher = servers
    out = tmp_path_factory.mktemp("opd") / "arithmetic.jsonl"
    argv = [
        "process", "--openai.base_url", student, "--openai.server_type", "vllm",
        "--openai.model_name", "atropos-tiny", "--env.tokenizer_name", "tiny",
        "--env.use_wandb", "false", "--env.group_size", "2", "--env.total_steps", "8",
        "--env.data_path_to_save_groups", str(out),
        "--teacher.base_url", teacher, "--teacher.model_name", "teacher",
        "--teacher.tokenizer_name", str(tiny_model_dir), "--teacher.top_k", str(TOP_K),
    ]  # fmt: skip
    assert main(registry.get("arithmetic"), argv) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def teacher_answer(teacher: str, tokens: list[int]) -> list[Any]:
    body = {"model": "teacher", "prompt": tokens, "max_tokens": 1, "prompt_logprobs": TOP_K}
    r = httpx.post(f"{teacher}/completions", json=body | {"temperature": 0}, timeout=60)
    r.raise_for_status()
    return r.json()["choices"][0]["prompt_logprobs"]


def test_process_writes_the_teachers_top_k_for_the_students_tokens(
    groups: list[dict[str, Any]], servers: tuple[str, str]
) -> None:
    assert len(groups) == 8
    for g in groups:
        assert g["token_source"] == "server"  # the student's own ids went to the teacher
        rows = zip(g["tokens"], g["distill_token_ids"], g["distill_logprobs"], strict=True)
        for seq, ids, lps in rows:
            assert len(ids) == len(lps) == len(seq)
            assert ids[0] == [] and all(len(top) == TOP_K for top in ids[1:])
    seq = groups[0]["tokens"][1]
    ids, lps = groups[0]["distill_token_ids"][1], groups[0]["distill_logprobs"][1]
    for t, position in enumerate(teacher_answer(servers[1], seq)):
        if position is None:
            assert t == 0
            continue
        best = sorted(position.items(), key=lambda kv: -kv[1]["logprob"])[:TOP_K]
        assert ids[t] == [int(i) for i, _ in best]
        assert lps[t] == pytest.approx([v["logprob"] for _, v in best], abs=1e-4)


@pytest.mark.parametrize("mode", ["reverse", "topk_forward"])
def test_the_trainer_distills_two_steps_on_those_groups(
    mode: str, groups: list[dict[str, Any]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    # reverse trains the tiny policy, which sampled the groups: on policy, every ratio is 1;
    # topk_forward trains the teacher's own weights: its first forward KL is 0, unless the
    # teacher's rows were misaligned with the trainer's positions
    model = Path("tiny") if mode == "reverse" else tiny_model_dir
    with serve_in_thread(create_app()) as url:
        r = httpx.post(f"{url}/scored_data_list", json=groups)
        assert r.status_code == 200, r.text
        out = tmp_path / "run"
        cfg = config(model, url, out, steps=2, seq_len=512, loss="opd", opd_mode=mode)
        last = train(cfg)
    assert last["step"] == 2
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["trained_tokens"] > 0 and r["loss"] == r["loss"]  # not NaN
        assert r["reverse_kl"] == r["reverse_kl"] and 0 <= r["teacher_topk_share"] <= 1
        assert ("forward_kl" in r) == (mode == "topk_forward")
    if mode == "reverse":
        assert rows[0]["mean_ratio"] == pytest.approx(1.0, abs=1e-3)
        assert rows[0]["grad_norm"] > 0
    else:
        assert rows[0]["forward_kl"] == pytest.approx(0.0, abs=1e-5)
        assert rows[1]["forward_kl"] > rows[0]["forward_kl"]  # one step moved it off the teacher


def test_opd_on_groups_without_teacher_logprobs_is_a_clear_error(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with serve_in_thread(create_app()) as url:
        push_groups(url, 2)
        with pytest.raises(MissingTeacher, match=r"--teacher\.base_url URL.*--loss grpo"):
            train(config(tiny_model_dir, url, tmp_path / "run", steps=1, loss="opd"))
