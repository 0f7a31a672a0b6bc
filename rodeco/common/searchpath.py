"""The Hydra ``SearchPathPlugin`` that puts the config dirs of rodeco's plugins on the search path. They go after
rodeco's own ``conf/``, when (and only when) the config being composed is rodeco's: other Hydra apps in the same
environment are left alone.

``rodeco.compose.prepare`` hands this module what to add (``compose_with``): the primary config's search path entry
(``pkg://rodeco.conf``) and the config dirs of the plugins it loaded (``rodeco_config_dirs``). The module is a leaf
(it imports nothing from rodeco), so the plugin reads what compose wrote without importing compose back.

Why compose registers the plugin with Hydra instead of Hydra finding it: Hydra discovers plugins by scanning the
``hydra_plugins`` namespace package, and setuptools' editable install maps its packages through an import hook that
that scan cannot walk, so a plugin shipped there is found from a wheel but not from ``pip install -e``. Registering
the class by hand works in both, and once the class is here, the scan has nothing left to find: the plugin has one
place and one way in, and no Hydra plugin package is shipped. Hydra keeps one entry per class, so registering on
every ``prepare`` is harmless. Compose rodeco's config through ``rodeco.load_config`` or the CLI, then (or call
``prepare`` before Hydra's compose API): nothing else adds the plugins' dirs. Launchers' worker processes (joblib,
submitit, Ray) need no plugin: they receive the parent's config loader, whose search path is already built.
"""

from __future__ import annotations

from collections.abc import Iterable

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

_app: str | None = None  # the search path entry of the config being composed (``pkg://rodeco.conf``)
_dirs: tuple[str, ...] = ()  # the plugins' config dirs that go after it


def compose_with(app: str, dirs: Iterable[str]) -> None:
    """Compositions whose search path holds ``app`` get ``dirs`` appended (each a directory path), in this order."""
    global _app, _dirs
    _app, _dirs = app, tuple(dirs)
    Plugins.instance().register(RodecoSearchPathPlugin)


class RodecoSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if _app is None or not any(e.path == _app for e in search_path.get_path()):
            return
        for d in _dirs:
            search_path.append(provider="rodeco-plugin", path=f"file://{d}")
