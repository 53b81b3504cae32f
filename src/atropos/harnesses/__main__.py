"""`python -m atropos.harnesses`: install every registered harness at its pinned version into
the harness cache (`make harnesses`); a no-op for those already there."""

from __future__ import annotations

import sys

from atropos.harnesses import HARNESSES
from atropos.harnesses.cache import HarnessInstallError


def main() -> int:
    failed = 0
    for name, harness in sorted(HARNESSES.items()):
        try:
            installed = harness().install()
        except HarnessInstallError as error:
            print(f"atropos.harnesses: {name}: {error}", file=sys.stderr)
            failed += 1
            continue
        where = ", ".join(str(p) for p in installed.mounts.values())
        print(f"atropos.harnesses: {name} {harness.version} ready ({where})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
