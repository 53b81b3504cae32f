"""`atropos local serve MODEL_DIR`: an OpenAI/vLLM-compatible inference server over transformers.

The flags are parsed here without importing torch; `serve` loads the model (docs/local.md).
"""

from __future__ import annotations

import argparse
import os
import sys

from atropos.cli import listen
from atropos.cli.api import add_access_arguments
from atropos.cli.argtypes import CHECK_ARGS_HELP, usage_error
from atropos.names import is_loopback

PROG = "atropos local serve"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `atropos local serve`."""
    p.add_argument(
        "model_dir",
        metavar="MODEL_DIR",
        help="a HF model directory (config.json, model.safetensors, tokenizer files), or 'tiny'"
        " for the tiny policy that ships with atropos",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    listen.add_allowed_host(p)
    p.add_argument(
        "--port", type=int, default=9001, help="port (default %(default)s; 0: any free port)"
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model name requests use and answers carry (default: MODEL_DIR as given)",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="'auto' (default): cuda when available, else cpu",
    )
    p.add_argument(
        "--max-batch-size", type=int, default=64, help="rows decoded together (default 64)"
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="prompt plus output tokens (default: the model's max_position_embeddings)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="seed the sampling of requests without a seed"
    )
    p.add_argument(
        "--policy-version",
        type=int,
        default=0,
        help="version of the weights loaded at start (default 0); each reload adds 1",
    )
    p.add_argument(
        "--transfer-backend",
        choices=["auto", "gloo", "nccl", "ipc"],
        default="auto",
        help="the process group weight transfers arrive over when the trainer's route names"
        " none (vLLM's): 'auto' (default) is nccl for a model on cuda, else gloo; 'ipc': a"
        " trainer on the same GPU sends CUDA IPC handles instead (no group; the handles are"
        " read by a restricted unpickler)",
    )
    add_guard_arguments(p)
    add_access_arguments(p, "ATROPOS_LOCAL_API_KEY", "/health")
    p.add_argument("--log-level", default="warning", help="uvicorn log level")
    p.add_argument("--check-args", action="store_true", help=CHECK_ARGS_HELP)


def add_guard_arguments(p: argparse.ArgumentParser) -> None:
    """What other local processes may make the server read or join: paths and rendezvous."""
    p.add_argument(
        "--allowed-paths",
        default=None,
        metavar="DIR[,DIR]",
        help="the directories LoRA adapters and reloaded checkpoints may be read from, after"
        " symlinks are resolved (default: the working directory and the system temp"
        " directory; give the trainer's --out-dir)",
    )
    p.add_argument(
        "--transfer-allow",
        default=None,
        metavar="HOST[,HOST]",
        help="the addresses (IPs, CIDR networks or host names as the trainer sends them) a"
        " weight-transfer rendezvous may be at (default: loopback only)",
    )
    p.add_argument(
        "--transfer-rendezvous-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long an init route waits for the trainer's group to form (default"
        " %(default)s); a later init or /resume cancels the wait",
    )


def check_args(args: argparse.Namespace) -> None:
    """Exit with a usage error (status 2) on flags that cannot work, before loading anything;
    MODEL_DIR 'tiny' becomes the shipped tiny policy's directory, served as the environments'
    default server expects (`atropos.inference.config.local_server_config`)."""
    if not is_loopback(args.host, resolve=True) and not args.api_key and not args.insecure:
        usage_error(
            PROG,
            f"refusing to bind {args.host} without an API key: anyone who can reach it could"
            " generate with your model and replace its weights. Pass --api-key KEY (or set"
            " ATROPOS_LOCAL_API_KEY), or --insecure if this network is trusted.",
        )
    from atropos.local.guard import AddressPolicy, split_list

    try:
        args.transfer_allow = AddressPolicy.parse(args.transfer_allow)
    except ValueError as err:
        usage_error(PROG, f"--transfer-allow: {err}")
    if args.allowed_paths is not None:
        args.allowed_paths = split_list(args.allowed_paths)
        missing = [d for d in args.allowed_paths if not os.path.isdir(os.path.expanduser(d))]
        if missing or not args.allowed_paths:
            usage_error(PROG, f"--allowed-paths: not a directory: {', '.join(missing) or '(none)'}")
    if not args.transfer_rendezvous_timeout > 0:
        usage_error(PROG, "--transfer-rendezvous-timeout must be above 0")
    if args.max_batch_size < 1:
        usage_error(PROG, f"--max-batch-size must be at least 1, got {args.max_batch_size}")
    if args.max_model_len is not None and args.max_model_len < 2:
        usage_error(PROG, f"--max-model-len must be at least 2, got {args.max_model_len}")
    if args.model_dir == "tiny":
        from atropos.inference.config import LOCAL_MAX_MODEL_LEN, LOCAL_MODEL_NAME
        from atropos.tiny.warmstart import policy_path

        args.model_dir = str(policy_path())
        args.served_model_name = args.served_model_name or LOCAL_MODEL_NAME
        args.max_model_len = args.max_model_len or LOCAL_MAX_MODEL_LEN
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        usage_error(
            PROG,
            f"MODEL_DIR {args.model_dir!r} is not a Hugging Face model directory (no"
            " config.json): pass one, or 'tiny' for the tiny policy that ships with atropos",
        )


def serve(args: argparse.Namespace) -> int:
    """Run the server until interrupted; the port is bound before the model loads."""
    check_args(args)
    if args.check_args:
        return 0
    from atropos.cli.listen import bind
    from atropos.local.server import run

    sock = bind(args.host, args.port, PROG)
    try:
        run(
            args.model_dir,
            sock,
            served_model_name=args.served_model_name,
            api_key=args.api_key or None,
            log_level=args.log_level,
            transfer_backend=args.transfer_backend,
            allowed_paths=args.allowed_paths,
            transfer_allow=args.transfer_allow,
            rendezvous_timeout=args.transfer_rendezvous_timeout,
            allowed_hosts=args.allowed_host,
            device=args.device,
            max_batch_size=args.max_batch_size,
            max_model_len=args.max_model_len,
            seed=args.seed,
            policy_version=args.policy_version,
        )
    except (ValueError, OSError) as err:
        sys.exit(f"{PROG}: error: {err}")
    return 0
