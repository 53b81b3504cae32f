"""`python -m atropos.trainer [flags]` is `atropos train [flags]`: the entry torchrun starts on
every process (``torchrun --nproc-per-node N -m atropos.trainer --model DIR ...``)."""

import sys

from atropos.cli.train import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
