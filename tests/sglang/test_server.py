"""The SGLang test target itself: its venv's lock, the stub libcuda it runs with, and a server
that is what the recipe says (`atropos.testing.sglang`): loopback only, float32 on the CPU,
stopped by pid. The server tests are opt-in (tests/conftest.py, `sglang_python`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from atropos.testing.sglang import SGLangServer, cuda_stub, driver_symbols, stub_source

ROOT = Path(__file__).resolve().parents[2]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements" / "sglang.txt").read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[canonicalize_name(name)] = version
    return pins


def test_the_sglang_lock_is_the_whole_venv() -> None:
    """It installs with --no-deps, so it must name everything SGLang imports."""
    pins = lock_pins()
    assert pins["sglang"] == "0.5.23" and pins["torch"] == "2.14.1"
    for needed in ("sglang-kernel", "transformers", "fastapi", "uvicorn", "pip", "setuptools"):
        assert needed in pins, needed


@pytest.mark.skipif(not shutil.which("gcc"), reason="gcc builds the stub (apt-get install gcc)")
def test_the_stub_defines_every_driver_symbol_a_library_imports(tmp_path: Path) -> None:
    """A library that calls two driver functions (and libc's): the stub defines exactly the
    two, each answering 34 (CUDA_ERROR_STUB_LIBRARY), and satisfies the loader."""
    user = tmp_path / "user.c"
    user.write_text(
        "int cuInit(int); int cuDriverGetVersion(int *);\n"
        "#include <string.h>\n"
        'int probe(void) { int v = 0; return cuInit(0) + cuDriverGetVersion(&v) + strlen(""); }\n'
    )
    library = tmp_path / "libuser.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", library, user], check=True)
    symbols = driver_symbols([library])
    assert symbols == ["cuDriverGetVersion", "cuInit"]
    assert stub_source(symbols).splitlines() == [
        "int cuDriverGetVersion(void) { return 34; }",
        "int cuInit(void) { return 34; }",
    ]
    venv = tmp_path / "venv"
    kernels = venv / "lib" / "python3.11" / "site-packages" / "sgl_kernel" / "sm90"
    kernels.mkdir(parents=True)
    shutil.copy(library, kernels / "common_ops.abi3.so")
    stub = cuda_stub(venv / "bin" / "python")
    assert stub == venv / "atropos-cuda-stub"
    nm = subprocess.run(["nm", "-D", "--defined-only", stub / "libcuda.so.1"], capture_output=True)
    assert {"cuDriverGetVersion", "cuInit"} <= set(nm.stdout.decode().split())
    built = (stub / "libcuda.so.1").stat().st_mtime_ns
    assert cuda_stub(venv / "bin" / "python") == stub  # the same symbols: not built again
    assert (stub / "libcuda.so.1").stat().st_mtime_ns == built


def test_the_command_is_the_recipes(tmp_path: Path) -> None:
    server = SGLangServer(tmp_path / "venv" / "bin" / "python", tmp_path)
    command = server.command()
    assert command[1:3] == ["-m", "sglang.launch_server"]
    for flag, value in [("--host", "127.0.0.1"), ("--device", "cpu"), ("--dtype", "float32"),
                        ("--served-model-name", "atropos-tiny")]:  # fmt: skip
        assert command[command.index(flag) + 1] == value
    env = server.environ()
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(tmp_path / "venv" / "atropos-cuda-stub")
    assert env["ATROPOS_TEST_SGLANG_SERVER"] == server.marker


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.status, answer.read().decode()


@pytest.mark.slow
def test_sglang_serves_the_tiny_policy_on_a_cpu_in_float32(sglang_server: SGLangServer) -> None:
    listening = sglang_server.listeners()
    assert any(x.port == sglang_server.port for x in listening)
    assert listening and all(x.loopback for x in listening), listening
    status, body = get(sglang_server.base_url + "/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["atropos-tiny"]
    info = json.loads(get(sglang_server.root + "/get_server_info")[1])
    assert info["device"] == "cpu" and info["dtype"] == "float32"
    assert info["attention_backend"] == "torch_native"
    log = sglang_server.log_path.read_text(errors="replace")
    assert "CUDA driver is a stub library" in log  # the stub answered, no driver was found
