"""Internal helpers shared by the entry points (``cli/``, ``server/``); not public API."""
