"""Key leases: how a team server's client derives its new jobs' secrets without asking the
server for each (``serialization/keys.py`` has the rest of the key design).

A lease is a random id; its secret is HMAC-SHA256 of the id under the user's secret (which
stays on the server: ``POST /api/v1/keys/lease`` hands out a new lease and its secret). A job
salted under a lease (``lease.<lease>.<random>``) has the secret HMAC-SHA256 of its name and
salt under the lease's secret, so the holder of a lease derives the secrets of the jobs it
salted and of no other job, and ``serialization.keys.job_secret`` derives the same value from
the user's secret for whoever reads the job later. No I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import os

__all__ = ["LEASE_PREFIX", "derive", "lease_of", "lease_secret", "leased_job_secret", "leased_salt",
           "new_lease", "new_salt"]

#: How a leased salt starts: ``lease.<lease>.<random>`` (``leased_salt``).
LEASE_PREFIX = "lease."
_SECRET_BYTES = 32


def derive(key: bytes, label: str, *parts: str) -> bytes:
    """HMAC-SHA256 of *label* and *parts* under *key*: every key of the design is one."""
    message = "\0".join((label, *parts)).encode()
    return hmac.new(key, message, hashlib.sha256).digest()


def new_salt() -> str:
    """A fresh random salt for a new job (stored on its record)."""
    return os.urandom(16).hex()


def new_lease() -> str:
    """A fresh key lease's id (a team server's client derives its jobs' secrets under it)."""
    return os.urandom(16).hex()


def lease_secret(user_secret: bytes, lease: str) -> bytes:
    """The secret of key lease *lease*: a client holding it derives the secrets of jobs
    whose salt names the lease (``leased_salt``), and of no other job; the user's secret
    stays with the server."""
    if not lease or not all(c in "0123456789abcdef" for c in lease):
        raise ValueError(f"a key lease is lowercase hex, not {lease!r}")
    return derive(user_secret, "shoal/key-lease/v1", lease)


def lease_of(salt: str) -> str | None:
    """The lease a job's *salt* names, or None (a salt drawn without one, or malformed)."""
    if not salt.startswith(LEASE_PREFIX):
        return None
    lease, dot, rest = salt[len(LEASE_PREFIX):].partition(".")
    ok = dot and rest and lease and all(c in "0123456789abcdef" for c in lease)
    return lease if ok else None


def leased_salt(lease: str) -> str:
    """A new job's salt under key lease *lease*."""
    return f"{LEASE_PREFIX}{lease}.{new_salt()}"


def leased_job_secret(secret: bytes, job: str, salt: str) -> str:
    """``job_secret`` of a job with a leased *salt*, from the lease's *secret*."""
    if len(secret) != _SECRET_BYTES or not salt.startswith(LEASE_PREFIX):
        raise ValueError(f"job {job!r}: {salt!r} is not a leased salt, or the lease secret "
                         "is not one")
    return derive(secret, "shoal/job-secret/v1", job, salt).hex()
