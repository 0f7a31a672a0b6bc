"""``rodeco.experiments.bench.length_controlled``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.length_controlled import main

if __name__ == "__main__":
    main(sys.argv[1:])
