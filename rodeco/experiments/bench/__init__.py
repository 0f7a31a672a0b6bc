"""rodeco's benchmarks and measurement runs, each a module with a ``main(argv)`` command line (``scripts/NAME.py``
runs it; so does ``python -m rodeco.experiments.bench.NAME``). They share one bootstrap
(``rodeco.experiments.bootstrap``), one matched speedup (``rodeco.experiments.speedup``) and one set of server
launchers (``servers``). ``REPO``: the source tree they read snapshots from and start servers in."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
