"""Entry scripts that shoal ships for its training jobs (run as files, not imported)."""
