"""``rodeco.experiments.bench.eos_share``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.eos_share import main

if __name__ == "__main__":
    sys.exit(main())
