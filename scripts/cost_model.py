"""``rodeco.experiments.bench.cost_model``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.cost_model import main

if __name__ == "__main__":
    main()
