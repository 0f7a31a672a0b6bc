"""``rodeco.experiments.bench.results_tables``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.results_tables import main

if __name__ == "__main__":
    sys.exit(main())
