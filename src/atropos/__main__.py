"""`python -m atropos` is the `atropos` command."""

from atropos.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
