"""``rodeco.experiments.bench.serve_load``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.serve_load import main

if __name__ == "__main__":
    main()
