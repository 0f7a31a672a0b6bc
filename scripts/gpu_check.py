"""``rodeco.experiments.bench.gpu_check``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
