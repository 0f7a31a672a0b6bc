"""``rodeco.experiments.bench.behaviour``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.behaviour import main

if __name__ == "__main__":
    sys.exit(main())
