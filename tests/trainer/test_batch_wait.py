"""The trainer says how long it waited for each batch: `data_wait_s` in its metrics and
"batch wait" in its progress line."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")

from atropos.api.app import create_app  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.trainer.train import train  # noqa: E402

from .helpers import config, metrics, push_groups  # noqa: E402


def test_the_wait_for_a_late_batch_is_logged(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with serve_in_thread(create_app()) as url:
        push_groups(url, 2)  # the first batch is there; the second comes 0.5 s later
        late = threading.Timer(0.5, push_groups, args=(url, 2), kwargs={"seed": 1})
        out = tmp_path / "run"
        with caplog.at_level(logging.INFO, "atropos.trainer"):
            late.start()
            try:
                train(config(tiny_model_dir, url, out, steps=2))
            finally:
                late.cancel()
                late.join(10)
    waits = [r["data_wait_s"] for r in metrics(out)]
    assert len(waits) == 2 and waits[0] >= 0.0
    lines = [r.getMessage() for r in caplog.records if " batch wait " in r.getMessage()]
    assert len(lines) == 2 and lines[1].endswith(f"batch wait {waits[1]:.2f}s")
    # the second batch was pushed 0.5 s after the start: the wait is no shorter than what is left
    assert waits[1] > 0.0
