"""``rodeco.experiments.bench.step_profile``'s command line (``--help``: what it does and its arguments)."""

from rodeco.experiments.bench.step_profile import main

if __name__ == "__main__":
    main()
