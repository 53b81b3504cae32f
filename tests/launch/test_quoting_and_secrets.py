"""What `atropos launch` writes, as an attacker reads it: no run-file string adds a line or a
command to `job.sbatch`, and no secret environment value is printed or written for others.

The property test draws hostile strings (newlines, `$(...)`, backticks, `;`, quotes, NUL, ...)
for every run-file field that reaches the script. Either the run file is refused with a clean
error naming the field, or the script passes `bash -n` and its head (up to the first step,
with `scontrol` stubbed) runs without creating the marker file the payload tries to create.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atropos.cli import launch as cli
from atropos.launch import config, keys, sbatch, slurm
from atropos.launch.plan import build, fill

from .runs import EXAMPLES

RUN: dict[str, Any] = {
    "run": {"name": "t", "backend": "slurm", "slurm": {"nodes": 3}},
    "inference": [{"name": "policy", "type": "local", "model": "tiny"}],
    "envs": [{"name": "arithmetic", "replicas": 2}],
    "trainer": {"model": "tiny"},
}
MARKER = "MARKER"  # replaced by the marker file's path in every payload
PAYLOADS = [
    "$(touch MARKER)", "`touch MARKER`", "x\ntouch MARKER", "x\rtouch MARKER\r",
    "x; touch MARKER", "x' ; touch MARKER; '", 'x" ; touch MARKER; "', "x && touch MARKER #",
    "\x00\ntouch MARKER", "${IFS}touch${IFS}MARKER", "a\n#SBATCH --wrap='touch MARKER'",
    '"$(touch MARKER)"', "'$(touch MARKER)'", "\\\ntouch MARKER", "x\n\ttouch MARKER",
]  # fmt: skip
PIECES = [
    "\n", "\r", "\x00", "\t", "\x1b", " ", ";", "&", "|", "'", '"', "`", "$(", ")", "${", "}",
    "#", "\\", "$", "touch MARKER", "gpu", "01:00:00", "=", "\u2028",
]  # fmt: skip
payloads = st.one_of(
    st.sampled_from(PAYLOADS),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=8).map("".join),
    st.text(max_size=12).map(lambda t: t + "$(touch MARKER)"),
)


def _set(data: dict[str, Any], field: str, value: str) -> None:
    run, slurm_settings = data["run"], data["run"]["slurm"]
    server, env, trainer = data["inference"][0], data["envs"][0], data["trainer"]
    setters = {
        "run.slurm.partition": lambda: slurm_settings.update(partition=value),
        "run.slurm.account": lambda: slurm_settings.update(account=value),
        "run.slurm.time": lambda: slurm_settings.update(time=value),
        "run.slurm.python": lambda: slurm_settings.update(python=value),
        "run.slurm.sbatch": lambda: slurm_settings.update(sbatch=["--comment=" + value]),
        "run.name": lambda: run.update(name=value),
        "api.host": lambda: data.setdefault("api", {}).update(host=value),
        "inference.0.host": lambda: server.update(host=value),
        "inference.0.model": lambda: server.update(model=value),
        "inference.0.served_model_name": lambda: server.update(served_model_name=value),
        "inference.0.environ.value": lambda: server.update(environ={"PLAIN": value}),
        "envs.0.environ.value": lambda: env.update(environ={"PLAIN": value}),
        "envs.0.environ.name": lambda: env.update(environ={value: "v"}),
        "envs.0.name": lambda: env.update(name=value),
        "envs.0.env": lambda: env.update(env={"system_prompt": value}),
        "trainer.command": lambda: trainer.update(command="python train.py " + value, model=None),
        "trainer.args": lambda: trainer.update(args={"run-name": value}),
    }
    setters[field]()


FIELDS = [
    "run.slurm.partition", "run.slurm.account", "run.slurm.time", "run.slurm.python",
    "run.slurm.sbatch", "run.name", "api.host", "inference.0.host", "inference.0.model",
    "inference.0.served_model_name", "inference.0.environ.value", "envs.0.environ.value",
    "envs.0.environ.name", "envs.0.name", "envs.0.env", "trainer.command", "trainer.args",
]  # fmt: skip

STUBS = {  # the Slurm commands the script's head calls, as no-ops (scontrol: three nodes)
    "scontrol": "#!/bin/sh\nprintf 'n0\\nn1\\nn2\\n'\n",
    "srun": "#!/bin/sh\nexit 0\n",
    "sbatch": "#!/bin/sh\nexit 0\n",
}


def _stubs(where: Path) -> Path:
    where.mkdir()
    for name, text in STUBS.items():
        (where / name).write_text(text)
        (where / name).chmod(0o755)
    return where


def _script_or_refusal(data: dict[str, Any], run_dir: Path) -> str | None:
    """The script of `data`, or None when the run file is refused with a clean error."""
    try:
        run = config.parse(data)
        plan = sbatch.place(build(run, run_dir), run)
        python = run.run.slurm.python or sys.executable
        return sbatch.script(plan, run, python=python, cwd=run_dir.parent)
    except (config.LaunchConfigError, sbatch.SlurmPlanError) as err:
        assert str(err).strip(), "a refusal says why"
        return None


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)  # fmt: skip
@given(field=st.sampled_from(FIELDS), payload=payloads)
def test_no_run_file_string_adds_a_line_or_a_command_to_the_script(
    field: str, payload: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        marker = root / "marker"
        data = copy.deepcopy(RUN)
        _set(data, field, payload.replace(MARKER, str(marker)))
        text = _script_or_refusal(data, root / "run")
        if text is None:
            return
        clean = _script_or_refusal(copy.deepcopy(RUN), root / "run")
        assert clean is not None
        # the payload adds no command: the script has as many lines outside comments as one
        # without it, and every #SBATCH line is one option
        assert len(_commands(text)) == len(_commands(clean))
        for line in text.split("\n"):
            assert not line.startswith("#SBATCH") or line.startswith("#SBATCH --"), line
        path = root / "job.sbatch"
        path.write_text(text)
        checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        head = text.split("\n# ---- start, tier by tier")[0] + "\nexit 0\n"
        (root / "head.sh").write_text(head)
        stubs = _stubs(root / "bin")
        environ = {
            "PATH": f"{stubs}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[0-2]", "HOME": tmp,
        }  # fmt: skip
        ran = subprocess.run(
            ["bash", str(root / "head.sh")], capture_output=True, text=True, env=environ,
            cwd=tmp, timeout=30,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert not marker.exists(), f"{field}={payload!r} ran a command"


def _commands(text: str) -> list[str]:
    """The script's lines that the shell runs (not comments, not #SBATCH lines)."""
    return [line for line in text.split("\n") if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('run.slurm.partition="a\\nb"', "run.slurm.partition: a newline cannot be part of a"),
        ('run.slurm.account="a b"', "run.slurm.account: ' ' cannot be part of a Slurm account"),
        ('run.slurm.time="1\\x00"', "run.slurm.time: a NUL cannot be part of a Slurm time"),
        ('run.slurm.python="/py\\n"', "run.slurm.python: a newline cannot be part of"),
        ('api.host="127.0.0.1\\nx"', "api.host: a newline cannot be part of a host name"),
        ('inference.0.model="m\\nx"', "inference[0].model: a newline cannot be part of"),
        ('run.slurm.setup=["a\\nb"]', "run.slurm.setup: a newline cannot be part of one setup"),
        ('trainer.command="python \'x"', "trainer.command: cannot split it into words"),
        ('envs.0.environ={A: "\\0"}', "envs[0].environ: A: a NUL cannot be part of"),
    ],
)
def test_a_hostile_value_is_a_usage_error_naming_the_field(
    override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    example = EXAMPLES / ("local.yaml" if override.startswith("api.") else "slurm.yaml")
    code = cli.main([str(example), "--dry-run", "--set", override])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_setup_lines_stay_the_users_own_shell_lines() -> None:
    run = config.parse(RUN, ["run.slurm.setup=['module load cuda\t# tab ok', 'source x']"])
    plan = sbatch.place(build(run, Path("/tmp/run")), run)
    text = sbatch.script(plan, run, python="/py", cwd=Path("/work"))
    assert "module load cuda\t# tab ok\nsource x\n" in text


# ----- secrets -----------------------------------------------------------------------------------

SECRETS = {
    "WANDB_API_KEY": "wandb-s3cret-1",  # secret by its name
    "MY_CREDENTIAL": {"value": "marked-s3cret-2", "secret": True},  # marked
    "HF_TOKEN": "hf-s3cret-3",
}
VALUES = ("wandb-s3cret-1", "marked-s3cret-2", "hf-s3cret-3", "sk-s3cret-7")
PLAIN = {"TOKENIZERS_PARALLELISM": {"value": "false", "secret": False}, "MY_FLAG": "shown-4"}


def test_secret_names_and_marks() -> None:
    run = config.parse({**RUN, "trainer": {"model": "tiny", "environ": {**SECRETS, **PLAIN}}})
    plan = build(run, Path("/tmp/run"))
    trainer = plan.get("trainer")
    assert trainer.secret_environ == sorted(SECRETS)
    assert trainer.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert trainer.environ["MY_FLAG"] == "shown-4"
    assert plan.secrets("trainer")["MY_CREDENTIAL"] == "marked-s3cret-2"
    assert not any(v in plan.model_dump_json() for v in VALUES)
    placed = sbatch.place(plan, run)  # a copy of the plan keeps them
    assert placed.secrets("trainer") == plan.secrets("trainer")


@pytest.mark.parametrize("example", ["slurm.yaml", "local.yaml"])
def test_dry_run_shows_secrets_as_stars(
    example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = json.dumps({**SECRETS, **PLAIN})
    argv = [str(EXAMPLES / example), "--dry-run", "--set", f"run.directory={tmp_path / 'r'}"]
    argv += ["--set", f"trainer.environ={environ}", "--set", f"envs.0.environ={environ}"]
    argv += ["--set", "envs.0.openai={api_key: sk-s3cret-7}"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert not any(v in out for v in VALUES)
    assert out.count("WANDB_API_KEY=***") == 2 and "MY_FLAG=shown-4" in out


def test_an_environments_openai_key_reaches_only_its_config_file() -> None:
    data = copy.deepcopy(RUN)
    data["inference"] = [{"name": "hosted", "type": "url", "url": "https://api.example/v1"}]
    data["envs"][0].update(replicas=1, openai={"api_key": "sk-s3cret-7'#", "timeout": 5})
    run = config.parse(data)
    plan = build(run, Path("/tmp/run"))
    env = plan.get("arithmetic")
    assert "sk-s3cret-7" not in plan.model_dump_json()
    (content,) = env.files.values()
    filled = fill(
        content, env, {}, python="py", run_dir=plan.run_dir, secrets=plan.secrets(env.name)
    )
    (server,) = yaml.safe_load(filled)["openai"]  # what the process reads
    assert server["api_key"] == "sk-s3cret-7'#" and server["timeout"] == 5
    shown = fill(content, env, {}, python="py", run_dir=plan.run_dir)
    assert "sk-s3cret-7" not in shown and "api_key: '***'" in shown  # what --dry-run shows


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _recorder(tmp_path: Path, out: Path, sleep: float) -> str:
    """A command that writes the environment variables it is given as names into `out`."""
    script = tmp_path / "recorder.py"
    script.write_text(
        "import json, os, sys, time\n"
        f"json.dump({{k: os.environ.get(k) for k in sys.argv[1:]}}, open({str(out)!r}, 'w'))\n"
        f"time.sleep({sleep})\n"
    )
    return f"{sys.executable} {script} {' '.join(SECRETS)} MY_FLAG RUN_DIR_TOKEN"


def test_the_slurm_files_hide_secrets_and_the_step_gets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `_submit` writes (sbatch stubbed), then one step run as the job would run it:
    its process gets the secrets in its environment; status, log and launch.json do not."""
    out = tmp_path / "seen.json"
    run_dir = tmp_path / "run"
    command = _recorder(tmp_path, out, 0)
    data = copy.deepcopy(RUN)
    # a secret value is a template as every environ value is: {run_dir} is filled in
    environ = {**SECRETS, **PLAIN, "RUN_DIR_TOKEN": "{run_dir}/t"}
    data["trainer"] = {"command": command, "environ": environ, "ready_timeout": 60}
    run = config.parse(data)
    plan = sbatch.place(build(run, run_dir), run)
    text = sbatch.script(plan, run, python=sys.executable, cwd=tmp_path)
    stubs = _stubs(tmp_path / "bin")
    (stubs / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    assert slurm._submit(plan, text) == "4242"
    for name, mode in (("plan.json", 0o600), ("job.sbatch", 0o700), ("secrets.json", 0o600)):
        assert _mode(run_dir / name) == mode, name
    assert _mode(run_dir / "api.key") == 0o600
    for name in ("plan.json", "job.sbatch", "job.json"):
        assert not any(v in (run_dir / name).read_text() for v in VALUES), name
    assert "#   env WANDB_API_KEY=***" in text
    assert keys.read_secrets(run_dir, "trainer")["HF_TOKEN"] == "hf-s3cret-3"
    # the trainer's step, as job.sbatch starts it (its address book from ATROPOS_ADDR_*)
    environ = {**os.environ, "ATROPOS_ADDR_api": "127.0.0.1:9", "ATROPOS_ADDR_policy": "x:9"}
    step = subprocess.run(
        [sys.executable, "-m", "atropos", "launch", "--step", "trainer", str(run_dir)],
        env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    seen = json.loads(out.read_text())
    assert seen == {
        "WANDB_API_KEY": "wandb-s3cret-1", "MY_CREDENTIAL": "marked-s3cret-2",
        "HF_TOKEN": "hf-s3cret-3", "MY_FLAG": "shown-4", "RUN_DIR_TOKEN": f"{run_dir}/t",
    }, step.stderr  # fmt: skip
    recorded = subprocess.run(
        [sys.executable, "-m", "atropos", "launch", "--record", str(run_dir)],
        env=environ, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    assert _mode(run_dir / "launch.json") == 0o600
    written = [run_dir / "launch.json", *run_dir.glob("status/*"), *run_dir.glob("logs/*")]
    for path in written:
        assert not any(v in path.read_text() for v in VALUES), path
    assert not any(v in step.stdout + step.stderr for v in VALUES)


def test_the_local_backend_hands_secrets_to_its_process(tmp_path: Path) -> None:
    """A whole local launch whose trainer writes what it sees: the secrets are in its
    environment; the launch's output, plan.json, launch.json and logs never hold them."""
    out = tmp_path / "seen.json"
    run_dir = tmp_path / "run"
    command = _recorder(tmp_path, out, 120)
    sets = [
        f"run.directory={run_dir}", "inference=[]", "trainer.model=null",
        f"trainer.command={json.dumps(command)}", "trainer.args={}",
        f"trainer.environ={json.dumps({**SECRETS, **PLAIN})}",
        f"api.environ={json.dumps(SECRETS)}",
    ]  # fmt: skip
    argv = [sys.executable, "-m", "atropos", "launch", str(EXAMPLES / "local.yaml"), "--no-live"]
    for item in sets:
        argv += ["--set", item]
    log = tmp_path / "launch.log"
    with log.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 180
        while not out.exists() or not out.read_text().endswith("}"):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seen = json.loads(out.read_text())
    assert seen["WANDB_API_KEY"] == "wandb-s3cret-1" and seen["HF_TOKEN"] == "hf-s3cret-3"
    assert seen["MY_CREDENTIAL"] == "marked-s3cret-2" and seen["MY_FLAG"] == "shown-4"
    assert _mode(run_dir / "plan.json") == 0o600 and _mode(run_dir / "launch.json") == 0o600
    assert not (run_dir / "secrets.json").exists()  # local: handed over in memory
    written = [log, run_dir / "plan.json", run_dir / "launch.json", *run_dir.glob("logs/*")]
    for path in written:
        assert not any(v in path.read_text() for v in VALUES), path
