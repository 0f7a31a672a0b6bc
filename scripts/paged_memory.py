"""``rodeco.experiments.bench.paged_memory``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.paged_memory import main

if __name__ == "__main__":
    main()
