"""The OpenEnv environments here import `openenv` (the interop venv's), not ours: not collected."""

collect_ignore = ["arith.py", "tools.py", "drive.py"]
