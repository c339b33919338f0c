"""Runtime environments for jobs: isolated virtualenvs built with uv, cached by their lock.

Built environments live under ``SHOAL_HOME/envs/<key>``, where the key hashes the resolved
lock, the Python ABI and the platform. A conda ``environment.yml`` is built by micromamba,
mamba or conda when one is on PATH (as ``conda-<key>`` beside them), else its ``pip:`` section
by uv; ``job_conda_env`` uses an existing named conda environment.

Public modules beside these names: ``shoal.envs.capture`` (auto-capture of a function's
requirements) and ``shoal.envs.workdir`` (the shipped working directory), which load only
when a job needs them.
"""

from shoal.envs._conda import (
    CondaEnvBuilder,
    CondaSpec,
    ensure_conda_file_env,
    ensure_named_conda_env,
    find_conda_tool,
    parse_environment_yml,
    plan_without_conda,
    resolve_conda_env,
)
from shoal.envs._runtime import ensure_package_path, ensure_runtime
from shoal.envs._sagemaker_alias import (
    sagemaker_alias_dir,
    shoal_requirements,
    write_sagemaker_alias_pth,
)
from shoal.envs._uv import BuiltEnv, EnvInfo, UvEnvBuilder, find_uv
from shoal.envs._wheels import NotInstallable, lowest_installable

__all__ = ["BuiltEnv", "CondaEnvBuilder", "CondaSpec", "EnvInfo", "NotInstallable",
           "UvEnvBuilder", "ensure_conda_file_env", "ensure_named_conda_env",
           "ensure_package_path", "ensure_runtime", "find_conda_tool", "find_uv",
           "lowest_installable", "parse_environment_yml", "plan_without_conda",
           "resolve_conda_env", "sagemaker_alias_dir", "shoal_requirements",
           "write_sagemaker_alias_pth"]
