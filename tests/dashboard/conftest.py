"""Shared parts of the dashboard tests: a tab of the headless Chromium (`browser`, from
tests/conftest.py), a seeded run, a tiny PNG reader."""

from __future__ import annotations

import contextlib
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from atropos.api import ApiConfig, create_app
from atropos.testing import serve_in_thread

KEY = "dash+key/0123"  # "+" and "/" survive the #key= fragment
INJECTION = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


@dataclass
class Tab:
    """A fresh page, and the script errors it raised (a test expects none)."""

    page: Any
    errors: list[str] = field(default_factory=list)


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    t = Tab(context.new_page())
    t.page.on("pageerror", lambda err: t.errors.append(str(err)))
    t.page.set_default_timeout(8000)
    try:
        yield t
    finally:
        context.close()


def registration(batch_size: int) -> dict[str, Any]:
    return {
        "wandb_group": "g",
        "wandb_project": "p",
        "batch_size": batch_size,
        "max_token_len": 2048,
        "checkpoint_dir": "ckpt",
        "save_checkpoint_interval": 10,
        "starting_step": 0,
        "num_steps": 100,
    }


def group(
    env_id: int, scores: list[float], version: int, text: str = "2 + 2 = 4"
) -> dict[str, Any]:
    """A group of len(scores) sequences, each with a short conversation."""
    n = len(scores)
    return {
        "tokens": [[1, 2, 3, 4 + i] for i in range(n)],
        "masks": [[-100, -100, 3, 4 + i] for i in range(n)],
        "scores": scores,
        "env_id": env_id,
        "policy_version": version,
        "messages": [
            [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": text}]
            for _ in range(n)
        ],
    }


def seed_run(client: httpx.Client) -> dict[str, int]:
    """A small run: a trainer (batch 4), two envs, groups of varied scores (one carrying an HTML
    injection), two batches consumed (step 2) and four stale groups dropped."""
    assert client.post("/register", json=registration(4)).status_code == 200
    assert client.get("/batch").json() == {"batch": None}  # the trainer starts
    envs = {}
    for name in ("alpha-env", "beta-env"):
        env = {"max_token_length": 2048, "desired_name": name, "weight": 1.0, "group_size": 2}
        envs[name] = client.post("/register-env", json=env).json()["env_id"]
    alpha, beta = envs["alpha-env"], envs["beta-env"]
    first = [
        group(alpha, [0.0, 1.0], 0),
        group(beta, [0.25, 0.5], 0),
        group(alpha, [1.0, 1.0], 0, text=INJECTION),
        group(beta, [-0.5, 0.75], 0),
        group(alpha, [0.5, 0.0], 0),
        group(beta, [0.1, 0.9], 0),
    ]
    assert client.post("/scored_data_list", json=first).status_code == 200
    assert len(client.get("/batch").json()["batch"]) == 2  # step 1
    fresh = [group(alpha, [0.3, 0.6], 1), group(beta, [0.2, 0.8], 1)]
    assert client.post("/scored_data_list", json=fresh).status_code == 200
    assert len(client.get("/batch").json()["batch"]) == 2  # drops the 4 version-0 groups: step 2
    client.post("/scored_data", json=group(alpha, [0.4, 0.45], 2))  # stays queued
    return envs


def png_size_and_colors(data: bytes, limit: int = 64) -> tuple[int, int, int]:
    """(width, height, distinct colours, capped at `limit`) of an 8-bit RGB(A) PNG, read by a
    small pure-Python decoder (Pillow is not a dependency)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, chunk = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color_type in (2, 6) and interlace == 0, "unexpected PNG format"
    bpp = 3 if color_type == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, colors = bytearray(stride), set()
    for y in range(height):
        kind, row = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):  # undo the row filter (PNG spec, section 9)
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                row[i] = (row[i] + a) & 255
            elif kind == 2:
                row[i] = (row[i] + b) & 255
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if len(colors) < limit:
            colors.update(bytes(row[i : i + bpp]) for i in range(0, stride, bpp * 7))
        prev = row
    return width, height, min(len(colors), limit)


@contextlib.contextmanager
def live_dashboard(tab: Tab, posts: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    """The API with a seeded run, `posts` (path, body) sent for its env "alpha-env" (the body's
    `env_id` filled in), and `tab` showing its dashboard, live; yields the API's URL."""
    with serve_in_thread(create_app(ApiConfig(api_key=KEY, history_interval=0.1))) as url:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as client:
            env_id = seed_run(client)["alpha-env"]
            for path, body in posts:
                reply = client.post(path, json={"env_id": env_id, **body})
                assert reply.status_code == 200, reply.text
        tab.page.goto(f"{url}/dashboard?interval=200#key={KEY}")
        expect(tab.page.locator("#conn")).to_have_text("live")
        yield url
