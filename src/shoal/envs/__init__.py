"""Runtime environments for jobs: isolated virtualenvs built with uv, cached by their lock.

Built environments live under ``SHOAL_HOME/envs/<key>``, where the key hashes the resolved
lock, the Python ABI and the platform. Conda files, auto-capture and the shipped working
directory are TODO(#3).
"""

from shoal.envs._runtime import ensure_runtime
from shoal.envs._uv import BuiltEnv, EnvInfo, UvEnvBuilder, find_uv

__all__ = ["BuiltEnv", "EnvInfo", "UvEnvBuilder", "ensure_runtime", "find_uv"]
