"""A real SGLang server on loopback, for tests: the shipped tiny policy served by SGLang on a CPU.

    with SGLangServer(python, tmp_path) as server:  # python: the SGLang venv's interpreter
        server.base_url  # "http://127.0.0.1:PORT/v1", served as "atropos-tiny"
        server.root  # "http://127.0.0.1:PORT": /generate, /pause_generation, ...

SGLang cannot share our venv (it pins torch 2.14.1 and its own transformers);
`scripts/upstream_venv.py sglang` makes its own from `requirements/sglang.txt`, and the caller
passes its python. Linux only (it reads /proc, and builds a shared library with gcc).

**Why a stub libcuda.** PyPI has SGLang 0.5.23 only as CUDA wheels (docs/inference.md, "SGLang
on a CPU"): its CPU engine (`SGLANG_USE_CPU_ENGINE=1`) imports `sgl_kernel`, whose `.so` files
link the CUDA driver, `libcuda.so.1`, which a machine without a GPU driver lacks: the import
fails and SGLang exits. Nothing from the driver is needed on a CPU without Intel AMX (SGLang
falls back to torch-native kernels), so `cuda_stub` builds a stand-in: every `cu*` driver
symbol the installed `sgl_kernel` libraries import (read with `nm -D --undefined-only`; 14 in
sglang-kernel 0.4.10), each `int f(void) { return 34; }` (34: CUDA_ERROR_STUB_LIBRARY, so the
CUDA runtime and torch report "no CUDA" instead of crashing), compiled with gcc into
`<venv>/atropos-cuda-stub/libcuda.so.1` and found through `LD_LIBRARY_PATH` in the server's
environment only. It is rebuilt when the symbol list changes (another sglang-kernel). On an
AMX Xeon SGLang would call CPU kernels this build of sgl_kernel lacks: not tried.

The recipe, measured with SGLang 0.5.23 on a 2-core machine (AVX-512, no AMX):

* `python -m sglang.launch_server --device cpu --dtype float32 --attention-backend
  torch_native --disable-overlap-schedule --max-total-tokens 4096`, in its own session and
  process group, output to `log_path`. float32 so its logprobs match transformers' forward pass
  on the same ids (`--dtype auto` runs this float32 model in float16); `--max-total-tokens`
  sizes the KV pool (SGLang would take free RAM: 10 GB); `--skip-server-warmup` (readiness
  runs a generation anyway: SGLang's `/health` generates one token). The context is the model's
  own (`max_position_embeddings`, 128 for the tiny policy). Ready in 38 s on a quiet machine
  (46 to 81 s while other tests ran), mostly imports.
* `SGLANG_RETURN_ORIGINAL_LOGPROB=1`: without it SGLang returns the logprobs of the
  temperature-scaled distribution it sampled from (at temperature 0.5, 0.4 nats off the
  policy's for a token), where a trainer wants the policy's own, as vLLM returns them.
* Modest on a shared machine: one OpenMP thread. Loopback and offline: `--host 127.0.0.1`
  (the HTTP server; SGLang's other sockets listen there too), its one-process torch.distributed
  group rendezvousing in a file (`SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE=file://...`; by
  default a TCP store listens on every interface), `HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`;
  caches (`XDG_CACHE_HOME`, triton's, torch's) under `base_dir`, not the home folder.
* Ready, and stopped by pid, as every `atropos.testing.server_process.ServerProcess`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from atropos.inference.config import LOCAL_MODEL_NAME
from atropos.testing.server_process import ServerProcess, tiny_policy_path

__all__ = ["SGLangServer", "cuda_stub", "driver_symbols", "stub_source"]

MARKER = "ATROPOS_TEST_SGLANG_SERVER"  # in the environment of every process a server starts
STUB_DIR = "atropos-cuda-stub"  # in the venv
CUDA_ERROR_STUB_LIBRARY = 34


def venv_of(python: str | os.PathLike[str]) -> Path:
    """The venv folder of its `bin/python` (not resolved: a venv's python is a link)."""
    return Path(os.path.abspath(python)).parent.parent


def driver_symbols(libraries: Sequence[Path]) -> list[str]:
    """The CUDA driver functions (`cu` and a capital) that `libraries` import, sorted.

    Raises:
        RuntimeError: `nm` (binutils) is missing.
    """
    nm = shutil.which("nm")
    if nm is None:
        raise RuntimeError("nm not found: install binutils (sudo apt-get install -y binutils gcc)")
    out = subprocess.run(
        [nm, "-D", "--undefined-only", *map(str, libraries)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    return sorted(n for n in names if len(n) > 2 and n.startswith("cu") and n[2].isupper())


def stub_source(symbols: Sequence[str]) -> str:
    """C source defining each symbol as a function that answers CUDA_ERROR_STUB_LIBRARY.

    >>> print(stub_source(["cuInit"]), end="")
    int cuInit(void) { return 34; }
    """
    return "".join(f"int {s}(void) {{ return {CUDA_ERROR_STUB_LIBRARY}; }}\n" for s in symbols)


def cuda_stub(python: str | os.PathLike[str]) -> Path:
    """The folder holding the SGLang venv's stub `libcuda.so.1` (see the module docstring),
    built with gcc on first use and again when the symbols `sgl_kernel` imports change.

    Raises:
        RuntimeError: no `sgl_kernel` in the venv, or gcc is missing (the message says how to
            install it).
    """
    venv = venv_of(python)
    libraries = sorted(venv.glob("lib/python3*/site-packages/sgl_kernel/**/*.so"))
    if not libraries:
        raise RuntimeError(f"no sgl_kernel libraries in {venv}: is it the SGLang venv?")
    source = stub_source(driver_symbols(libraries))
    folder = venv / STUB_DIR
    c_file, library = folder / "cuda.c", folder / "libcuda.so.1"
    if library.exists() and c_file.exists() and c_file.read_text() == source:
        return folder
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError(
            "gcc not found: the SGLang tests build a stub libcuda.so.1 with it; install it"
            " with `sudo apt-get install -y gcc` (`make test-sglang` does)"
        )
    folder.mkdir(exist_ok=True)
    c_file.write_text(source)
    built = folder / "libcuda.so.1.tmp"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(built), str(c_file)],
        check=True,
    )
    built.replace(library)
    return folder


class SGLangServer(ServerProcess):
    """SGLang serving a model on 127.0.0.1's CPU, started on enter (or `start()`), stopped on
    exit (start, readiness and stop: `atropos.testing.server_process.ServerProcess`).

    Args:
        python: the interpreter of the SGLang venv (`scripts/upstream_venv.py sglang`).
        base_dir: where the log (`sglang-PORT.log`) and SGLang's caches go.
        model: a Hugging Face model folder (default: the shipped tiny policy).
        served_model_name: the name requests use (default "atropos-tiny", as the local server).
        extra_args: more server arguments.
        extra_env: more environment variables.
        max_total_tokens: `--max-total-tokens`, the KV pool's size in tokens.
        start_timeout: seconds the start may take until ready.
        stop_grace: seconds between SIGTERM and SIGKILL (and for the strays after).
    """

    label, log_name, marker_key = "SGLang", "sglang", MARKER

    def __init__(
        self,
        python: str | os.PathLike[str],
        base_dir: str | os.PathLike[str],
        *,
        model: str | os.PathLike[str] | None = None,
        served_model_name: str = LOCAL_MODEL_NAME,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        max_total_tokens: int = 4096,
        start_timeout: float = 300.0,
        stop_grace: float = 15.0,
    ) -> None:
        super().__init__(
            python, base_dir, served_model_name=served_model_name,
            start_timeout=start_timeout, stop_grace=stop_grace,
        )  # fmt: skip
        self.model = Path(model) if model is not None else tiny_policy_path()
        self.extra_args, self.extra_env = list(extra_args), dict(extra_env or {})
        self.max_total_tokens = max_total_tokens
        self.store_path = self.base_dir / f"sglang-{self.port}-{self.marker[:8]}.store"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        command = [str(self.python), "-m", "sglang.launch_server"]
        command += ["--model-path", str(self.model), "--served-model-name", self.served_model_name]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu"]
        command += ["--dtype", "float32", "--attention-backend", "torch_native"]
        command += ["--disable-overlap-schedule", "--max-total-tokens", str(self.max_total_tokens)]
        command += ["--random-seed", "0", "--skip-server-warmup"]
        return command + self.extra_args

    def environ(self) -> dict[str, str]:
        """The server's environment: ours, less our venv, plus the recipe's variables."""
        env = super().environ()
        cache = self.base_dir / "sglang-cache"
        stub = str(venv_of(self.python) / STUB_DIR)
        env.update(
            {
                "SGLANG_USE_CPU_ENGINE": "1",
                "SGLANG_RETURN_ORIGINAL_LOGPROB": "1",  # the policy's logprobs, not tempered
                # its process group meets in a file, not at a TCP store on every interface
                "SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE": f"file://{self.store_path}",
                "LD_LIBRARY_PATH": os.pathsep.join(
                    filter(None, [stub, env.get("LD_LIBRARY_PATH")])
                ),
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "DO_NOT_TRACK": "1",
                "XDG_CACHE_HOME": str(cache),
                "TRITON_CACHE_DIR": str(cache / "triton"),
                "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            }
        )
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Build the stub libcuda if needed (`cuda_stub`), then start as every server does."""
        if self.python.exists():
            cuda_stub(self.python)
        super().start()
