"""``rodeco.experiments.bench.serve_bench``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.serve_bench import main

if __name__ == "__main__":
    main()
