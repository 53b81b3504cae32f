"""`atropos view` and `view-run` end to end (view-run against a live API in a thread)."""

from __future__ import annotations

import httpx
import pytest

from atropos.api.app import ApiConfig, create_app
from atropos.cli import view as view_cli
from atropos.cli.main import main as atropos_main
from atropos.testing import serve_in_thread

from .conftest import chat_group, page_json, write_jsonl


def test_atropos_view_writes_one_page_of_several_files(tmp_path, tiny, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", [chat_group(tiny, ["x", "y"], [1.0, 0.0])] * 2)
    b = write_jsonl(tmp_path / "b.jsonl", [chat_group(tiny, ["z"], [0.5]), "oops"])
    out = tmp_path / "pages" / "all.html"
    rc = atropos_main(["view", str(a), str(b), "-o", str(out), "--tokenizer", "tiny"])
    assert rc == 0
    assert capsys.readouterr().out.strip() == f"{out} (3 groups, 1 bad line skipped)"
    data = page_json(out.read_text())
    assert [s["name"] for s in data["sources"]] == ["a.jsonl", "b.jsonl"]
    assert data["tokenizer"] == "tiny" and data["bad"] == 1
    assert all(s["pieces"] and s["runs"] for g in data["groups"] for s in g["seqs"])
    assert not list(out.parent.glob(".*tmp"))  # written through a temporary file


def test_default_out_is_beside_the_first_file_and_limit_is_said(tmp_path, capsys):
    path = write_jsonl(tmp_path / "run.jsonl", [{"tokens": [[1]], "scores": [1]}] * 5)
    assert view_cli.main([str(path), "--limit", "2"]) == 0
    assert "run.html (2 groups, 3 more not read (--limit))" in capsys.readouterr().out
    data = page_json((tmp_path / "run.html").read_text())
    assert len(data["groups"]) == 2 and data["unread"] == 3 and data["limit"] == 2
    assert any("Showing the first 2 groups" in n for n in data["notes"])


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "give one or more JSONL FILEs"),
        (["missing.jsonl"], "no such file: missing.jsonl"),
        (["--api-url", "http://x", "f.jsonl"], "not both"),
    ],
)
def test_usage_errors(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.jsonl").write_text("")
    assert view_cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_tokenizer_is_a_clear_error(tmp_path, capsys):
    path = write_jsonl(tmp_path / "run.jsonl", [{"tokens": [[1]], "scores": [1]}])
    assert view_cli.main([str(path), "--tokenizer", str(tmp_path / "nope")]) == 2
    assert "could not load tokenizer" in capsys.readouterr().err


def test_view_run_reads_a_live_api_without_changing_it(tmp_path, tiny, capsys, monkeypatch):
    monkeypatch.setenv("ATROPOS_API_KEY", "k3y")
    auth = {"Authorization": "Bearer k3y"}
    with serve_in_thread(create_app(ApiConfig(api_key="k3y"))) as url:
        with httpx.Client(base_url=url, headers=auth) as c:
            reg = {
                "wandb_group": "g",
                "wandb_project": "p",
                "batch_size": 4,
                "max_token_len": 512,
                "checkpoint_dir": "c",
                "save_checkpoint_interval": 10,
                "starting_step": 0,
                "num_steps": 10,
            }
            assert c.post("/register", json=reg).status_code == 200
            for k in range(5):
                group = chat_group(tiny, [f"answer {k}", "<script>x</script>"], [k, 0.0])
                assert c.post("/scored_data", json=group).status_code == 200
            assert c.get("/batch").json()["batch"] is not None  # two groups consumed
            before = [c.get(p).json() for p in ("/status", "/info", "/wandb_info")]
            stats_before = c.get("/stats").json()

            out = tmp_path / "live.html"
            argv = ["--api-url", url, "-o", str(out), "--limit", "4", "--tokenizer", "tiny"]
            assert view_cli.view_run([*argv, "--port", "9001", "--group-size", "2"]) == 0
            captured = capsys.readouterr()
            assert captured.out.strip() == f"{out} (4 groups)"
            assert "--port is ignored" in captured.err

            after = [c.get(p).json() for p in ("/status", "/info", "/wandb_info")]
            assert after == before  # nothing consumed, registered or reset
            stats_after = c.get("/stats").json()
            for key in ("step", "registered", "queued_groups", "leased_batches", "envs"):
                assert stats_after[key] == stats_before[key]
            assert c.get("/batch").json()["batch"] is not None  # the queue is still there

    data = page_json(out.read_text())
    assert [g["where"] for g in data["groups"]] == ["seq 2", "seq 3", "seq 4", "seq 5"]
    assert [g["seqs"][0]["score"] for g in data["groups"]] == [1.0, 2.0, 3.0, 4.0]
    assert all(g["received"] for g in data["groups"])
    assert data["groups"][0]["seqs"][1]["messages"][1]["content"] == "<script>x</script>"
    assert any("read-only" in n for n in data["notes"])


def test_view_run_explains_a_refused_key_and_an_unreachable_api(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ATROPOS_API_KEY", raising=False)
    out = tmp_path / "x.html"
    with serve_in_thread(create_app(ApiConfig(api_key="k3y"))) as url:
        assert view_cli.view_run(["--api-url", url, "-o", str(out)]) == 1
        assert "refused the key" in capsys.readouterr().err
    assert view_cli.view_run(["--api-url", url, "-o", str(out)]) == 1
    assert "could not reach" in capsys.readouterr().err
    assert not out.exists()


def test_view_run_default_page_and_watch_rewrites(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATROPOS_API_KEY", raising=False)
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(view_cli, "_sleep", sleep)
    with serve_in_thread(create_app(ApiConfig())) as url:
        assert view_cli.view_run(["--api-url", url, "--watch", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["runs/view-run.html (0 groups)"] * 2 and calls == [0.5, 0.5]
    assert page_json((tmp_path / "runs" / "view-run.html").read_text())["groups"] == []


def test_atropos_view_reads_an_api_too(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ATROPOS_API_KEY", raising=False)
    out = tmp_path / "api.html"
    with serve_in_thread(create_app(ApiConfig())) as url:
        group = {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [0.5], "env_id": None}
        httpx.post(f"{url}/scored_data", json=group).raise_for_status()
        assert atropos_main(["view", "--api-url", url, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out} (1 group)"
    data = page_json(out.read_text())
    assert data["title"] == f"rollouts of {url}" and data["sources"][0]["name"] == url
