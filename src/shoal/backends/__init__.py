"""Backends launch supervisors and report facts about their processes; nothing more.

Registry of implementations by dotted path, so ``import shoal`` never imports ray.
"""

from __future__ import annotations

__all__ = ["BACKENDS", "backend_path"]

BACKENDS: dict[str, str] = {
    "local": "shoal.backends.local:LocalBackend",
    "ray": "shoal.backends.ray:RayBackend",
}


def backend_path(name: str) -> str:
    from shoal.errors import ConfigError

    key = "ray" if name.startswith("ray://") else name
    try:
        return BACKENDS[key]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}",
                          backend=name) from None
