"""Hydra finds this plugin by scanning the ``hydra_plugins`` namespace package. It adds the config dirs that rodeco's
plugins declare (``rodeco_config_dirs``) to the search path, after rodeco's own ``conf/``, when (and only when) the
app being composed is rodeco's: other Hydra apps in the same environment are left alone."""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

RODECO_CONF = "pkg://rodeco.conf"


class RodecoSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not any(e.path == RODECO_CONF for e in search_path.get_path()):
            return
        from rodeco.compose import plugin_config_dirs

        for d in plugin_config_dirs():
            search_path.append(provider="rodeco-plugin", path=f"file://{d}")
