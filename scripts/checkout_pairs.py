"""``rodeco.experiments.bench.checkout_pairs``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.checkout_pairs import main

if __name__ == "__main__":
    main()
