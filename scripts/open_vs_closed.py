"""``rodeco.experiments.bench.open_vs_closed``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.open_vs_closed import main

if __name__ == "__main__":
    main()
