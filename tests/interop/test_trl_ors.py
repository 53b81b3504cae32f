"""TRL's own ORS integration trains against `atropos env publish gsm8k --as ors` on CPU, without
vLLM: `GRPOTrainer(environment_factory=OpenRewardSpec(URL).environment_factory)` (TRL 1.16,
`trl.experimental.openreward`, on openreward's client), transformers' own generation, the tiny
policy, two steps. Each rollout opens a session on our server and reads its prompt; the tool
TRL binds is our `answer`. (The tiny policy does not call it, so no reward comes back: what
is checked is the plumbing, not learning.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from atropos.tiny.warmstart import policy_path

from .ors_helpers import published

CLIENT = Path(__file__).resolve().parent / "clients" / "trl_ors.py"


def test_trl_grpo_trains_on_published_gsm8k_through_its_ors_integration(
    trl_python: Path, interop_python: Path, tmp_path: Path
) -> None:
    site = next((interop_python.parent.parent / "lib").glob("python3*/site-packages"))
    with published("gsm8k") as url:
        extra = {  # the SDK's session host is the server itself (not sessions.HOST)
            "OPENREWARD_SESSION_URL": url, "OPENREWARD_DISABLE_UPDATE_CHECK": "1",
            "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1",
        }  # fmt: skip
        argv = [str(trl_python), str(CLIENT), url, "gsm8k", str(policy_path()), str(tmp_path)]
        done = subprocess.run(
            [*argv, str(site)], env={**os.environ, **extra}, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["steps"] == 2 and report["rows"] == 2 and report["tools"] == ["answer"]
    assert report["rollouts"] == 4  # 2 tasks x 2 generations, each a session of ours
    assert all(r is None or -1.0 <= r <= 1.0 for r in report["rewards"])
