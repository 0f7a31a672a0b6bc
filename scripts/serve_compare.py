"""``rodeco.experiments.bench.serve_compare``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.serve_compare import main

if __name__ == "__main__":
    main()
