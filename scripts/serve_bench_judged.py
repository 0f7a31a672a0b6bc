"""``rodeco.experiments.bench.serve_bench_judged``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.serve_bench_judged import main

if __name__ == "__main__":
    sys.exit(main())
