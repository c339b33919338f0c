"""The web console (issue #21): server-rendered pages over the stores, for ``shoal ui`` (the
embedded default, loopback, no login) and mounted in ``shoal server`` at ``/console``.

Jinja2 templates (every value escaped) with htmx partial updates and uPlot charts, vendored
in ``static/vendor/`` (``scripts/fetch_console_assets.py``); no Node toolchain, no CDN.
"""

from shoal.console._app import create_console
from shoal.console._ui import server_console, ui_app, ui_config

__all__ = ["create_console", "server_console", "ui_app", "ui_config"]
