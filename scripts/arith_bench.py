"""``rodeco.experiments.bench.arith_bench``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.arith_bench import main

if __name__ == "__main__":
    sys.exit(main())
