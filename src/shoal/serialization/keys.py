"""Per-job keys derived from a user's secret, and the sealing of a job's secret variables.

No I/O: the user's secret arrives as bytes (``shoal.jobs.keys`` reads it from its file).

* ``job_secret(user_secret, job, salt)``: the one value a job's supervisor is handed,
  HMAC-SHA256 of the job's name and its random salt (stored on the job's record, useless
  without the user's secret) under the user's secret.
* ``lease_secret(user_secret, lease)``: a team server's client asks for one key lease
  (``POST /keys/lease``) and derives the secrets of the jobs it salts under it itself
  (``leased_salt``, ``leased_job_secret``), instead of asking the server for each new job's;
  ``job_secret`` derives the same value from the user's secret and the salt.
* ``payload_key(job_secret)``: the HMAC key of the job's payloads (``serialize``), the only key
  the job's own code receives.
* ``seal_env`` / ``open_env``: the values of the job's secret-looking environment variables,
  encrypted (AES-256-GCM) under a key derived from the job's secret, so the stored spec never
  holds them in plain text.

Each derived key is HMAC-SHA256 under its parent with a distinct label: knowing a payload key
reveals neither the job's secret nor its environment key, and no job's keys reveal another's.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping

from shoal.core.leases import (
    LEASE_PREFIX,
    lease_of,
    lease_secret,
    leased_job_secret,
    leased_salt,
    new_lease,
    new_salt,
)
from shoal.core.leases import (
    derive as _derive,
)
from shoal.core.secrets import is_secret_name
from shoal.errors import PayloadIntegrityError

__all__ = ["LEASE_PREFIX", "SEALED_PREFIX", "USER_SECRET_BYTES", "is_sealed", "job_secret",
           "lease_secret", "leased_job_secret", "leased_salt", "new_lease", "new_salt",
           "open_env", "payload_key", "seal_env"]

#: The size of a user's secret.
USER_SECRET_BYTES = 32
#: How a sealed value starts in a stored spec: ``shoal-sealed:v1:<base64url(nonce|ciphertext)>``.
SEALED_PREFIX = "shoal-sealed:v1:"
_NONCE_BYTES = 12


def job_secret(user_secret: bytes, job: str, salt: str) -> str:
    """The job's own secret (hex), from which its payload and environment keys derive. A
    leased salt (``lease.<lease>.<random>``) derives it under that lease's secret."""
    if len(user_secret) != USER_SECRET_BYTES:
        raise ValueError(f"a user secret has {USER_SECRET_BYTES} bytes, not {len(user_secret)}")
    if not salt:
        raise ValueError(f"job {job!r} has no key salt")
    lease = lease_of(salt)
    if lease is not None:
        return leased_job_secret(lease_secret(user_secret, lease), job, salt)
    return _derive(user_secret, "shoal/job-secret/v1", job, salt).hex()


def payload_key(secret: str) -> str:
    """The HMAC key (hex) of the job's payloads, derived from its secret."""
    return _derive(bytes.fromhex(secret), "shoal/payload-key/v1").hex()


def _env_key(secret: str) -> bytes:
    return _derive(bytes.fromhex(secret), "shoal/environment-key/v1")


def is_sealed(value: str) -> bool:
    return isinstance(value, str) and value.startswith(SEALED_PREFIX)


def seal_env(env: Mapping[str, str], secret: str, job: str) -> dict[str, str]:
    """*env* with the value of each secret-looking name encrypted for job *job*."""
    if not any(is_secret_name(k) and not is_sealed(v) for k, v in env.items()):
        return dict(env)
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(_env_key(secret))
    out = {}
    for name, value in env.items():
        if is_secret_name(name) and not is_sealed(value):
            nonce = os.urandom(_NONCE_BYTES)
            sealed = aead.encrypt(nonce, value.encode(), f"{job}\0{name}".encode())
            value = SEALED_PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()
        out[name] = value
    return out


def open_env(env: Mapping[str, str], secret: str, job: str) -> dict[str, str]:
    """*env* with every sealed value decrypted (values stored in the clear pass as they are).

    Raises PayloadIntegrityError naming the job and the variable if one does not decrypt."""
    if not any(is_sealed(v) for v in env.values()):
        return dict(env)
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(_env_key(secret))
    out = {}
    for name, value in env.items():
        if is_sealed(value):
            try:
                raw = base64.urlsafe_b64decode(value[len(SEALED_PREFIX):].encode())
                value = aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:],
                                     f"{job}\0{name}".encode()).decode()
            except (InvalidTag, ValueError) as e:
                raise PayloadIntegrityError(
                    f"environment variable {name} of job {job} does not decrypt under the "
                    "job's key: the stored spec was changed, or the job was submitted with "
                    "another user secret", job=job, variable=name) from e
        out[name] = value
    return out
