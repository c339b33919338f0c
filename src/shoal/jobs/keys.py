"""Where each job's keys come from: the user's secret on the client, the handover in a job.

The client (``UserKeys``) holds the user's secret, a file of 32 random bytes outside every
store (``$XDG_CONFIG_HOME/shoal/user-secret``, 0600; ``SHOAL_USER_SECRET_FILE`` elsewhere),
and derives each job's secret from it (``shoal.serialization.keys``). A job's supervisor
knows only the secrets its client handed it, in ``SHOAL_JOB_SECRETS`` of its environment,
which it takes out (``take_handover``) before any job code runs (``JobService.hand_over``). Neither the metadata store nor the
artifact store ever holds a key: a job that reads them all can still sign nothing another
user's client accepts.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

from shoal.core.ports import JobKeys
from shoal.core.secrets import JOB_SECRETS_VAR, secret_values
from shoal.errors import ConfigError
from shoal.serialization.keys import USER_SECRET_BYTES, job_secret

__all__ = ["JOB_SECRETS_VAR", "JobKeys", "UserKeys", "encode_handover",
           "load_user_secret", "secret_values_seen", "take_handover"]

#: Secret-looking variables inherited from the client's environment are masked in the job's
#: log from this length on (shorter ones, "1" or "true", would mask ordinary output).
_INHERITED_SECRET_MIN = 8



class UserKeys(JobKeys):
    """The client's side: derives every job's secret from the user's secret file (read, or
    created, on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._secret: bytes | None = None
        self._lock = threading.Lock()

    def secret(self, job: str, salt: str) -> str:
        with self._lock:
            if self._secret is None:
                self._secret = load_user_secret(self.path)
        return job_secret(self._secret, job, salt)

    def secrets(self, jobs: Sequence[tuple[str, str]]) -> list[str]:
        return [self.secret(job, salt) for job, salt in jobs]


def secret_values_seen(job_env: Mapping[str, str], inherited: Mapping[str, str]
                       ) -> tuple[str, ...]:
    """Every secret value a job sees, longest first: those of its own secret-looking variables
    (decrypted) and those of the environment it inherits (its supervisor's: the client's)."""
    values = set(secret_values(job_env))
    values.update(secret_values({k: v for k, v in inherited.items()
                                 if k not in (JOB_SECRETS_VAR, "SHOAL_JOB_KEY")},
                                min_length=_INHERITED_SECRET_MIN))
    return tuple(sorted(values, key=len, reverse=True))


def encode_handover(secrets: Mapping[str, str]) -> str:
    return json.dumps(dict(secrets), sort_keys=True)


def take_handover(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Remove the handed-over job secrets from *environ* (the supervisor's) and return them."""
    raw = environ.pop(JOB_SECRETS_VAR, None)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def load_user_secret(path: Path) -> bytes:
    """The user's secret in *path*; created (32 random bytes, 0600, in a 0700 directory) if
    the file does not exist. Refuses a file others may read, or of the wrong size."""
    path = Path(path).expanduser()
    try:
        try:
            return _read_secret(path)
        except FileNotFoundError:
            _create_secret(path)
        return _read_secret(path)
    except OSError as e:
        raise ConfigError(f"cannot read the shoal user secret {path}: {e}",
                          path=str(path)) from e


def _read_secret(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"the shoal user secret {path} is not a regular file", path=str(path))
        if st.st_mode & 0o077:
            raise ConfigError(
                f"the shoal user secret {path} may be read by other users (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); run 'chmod 600 {path}', and if others may "
                "have read it, delete it (the results of jobs already run then cannot be "
                "verified any more)", path=str(path), mode=oct(stat.S_IMODE(st.st_mode)))
        if st.st_uid != os.getuid():
            raise ConfigError(f"the shoal user secret {path} belongs to another user (uid "
                              f"{st.st_uid})", path=str(path))
        data = os.read(fd, USER_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != USER_SECRET_BYTES:
        raise ConfigError(
            f"the shoal user secret {path} holds {len(data)} bytes, not {USER_SECRET_BYTES}: it "
            "is damaged or not shoal's. Restore it from a backup, or delete it to start a new "
            "one (the results of jobs already run then cannot be verified any more)",
            path=str(path), size=len(data))
    return data


def _create_secret(path: Path) -> None:
    """Write a new secret atomically: concurrent first uses agree on one file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(USER_SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process created it first: theirs wins
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot create the shoal user secret {path}: {e}",
                          path=str(path)) from e
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
