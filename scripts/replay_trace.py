"""``rodeco.experiments.bench.replay_trace``'s command line (``--help``: what it does and its arguments)."""

import sys

from rodeco.experiments.bench.replay_trace import main

if __name__ == "__main__":
    sys.exit(0 if main() else 1)
