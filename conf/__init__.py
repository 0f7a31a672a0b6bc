# conf/ is installed as the package rodeco.conf (package-dir in pyproject.toml), so Hydra finds it as pkg://rodeco.conf.
