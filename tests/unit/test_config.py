"""config: SHOAL_* settings and SageMaker-schema defaults files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shoal.config import REMOTE_FUNCTION_KEYS, Settings, load_defaults
from shoal.errors import ConfigError

SRC = Path(__file__).parents[2] / "src" / "shoal"

SEED = """\
SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      RemoteFunction:
        InstanceType: ml.m5.large
        Dependencies: ./requirements.txt
        EnvironmentVariables: {"EnvVarKey": "EnvVarValue"}
        Tags:
          - {"Key": "someTagKey", "Value": "someTagValue"}
"""

#: A SageMaker config that sets every RemoteFunction key (and both Session keys).
FULL = """\
SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      Session:
        DefaultS3Bucket: my-bucket
        DefaultS3ObjectKeyPrefix: some/prefix
      RemoteFunction:
        Dependencies: ./requirements.txt
        EnableInterContainerTrafficEncryption: true
        EnvironmentVariables:
          EnvVarKey: EnvVarValue
        ImageUri: 123456789012.dkr.ecr.us-west-2.amazonaws.com/my-image:latest
        IncludeLocalWorkDir: true
        CustomFileFilter:
          IgnoreNamePatterns: ["data/*", "*.pyc"]
        InstanceType: ml.m5.xlarge
        JobCondaEnvironment: my-env
        PreExecutionCommands: ["echo one", "echo two"]
        PreExecutionScript: ./pre.sh
        RoleArn: arn:aws:iam::123456789012:role/MyRole
        S3KmsKeyId: kms-key-s3
        S3RootUri: s3://my-bucket/root
        Tags:
          - Key: team
            Value: ml
        VolumeKmsKeyId: kms-key-volume
        VpcConfig:
          SecurityGroupIds: ["sg-1"]
          Subnets: ["subnet-1", "subnet-2"]
  TrainingJob:
    EnableNetworkIsolation: true
CustomParameters:
  anything: goes
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _rf(body: str) -> str:
    """A config whose RemoteFunction section is *body* (already indented 8 spaces)."""
    return ("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
            "      RemoteFunction:\n" + body)


# --- Settings -----------------------------------------------------------------------------

def test_settings_respect_shoal_home(clean_env: Path) -> None:
    settings = Settings()
    assert settings.home == clean_env
    assert settings.resolved_metadata_url() == f"sqlite:///{clean_env / 'shoal.db'}"
    assert settings.resolved_artifact_url() == f"file://{clean_env / 'artifacts'}"
    assert settings.sources()["home"] == "env SHOAL_HOME"
    assert settings.sources()["backend"] == "default"


def test_settings_default_home_is_dot_shoal(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.delenv("SHOAL_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings().home == tmp_path / ".shoal"


def test_arguments_beat_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHOAL_BACKEND", "ray")
    settings = Settings(home=tmp_path / "h", metadata_url="postgresql://u@h/db")
    assert settings.home == tmp_path / "h"
    assert settings.backend == "ray"
    assert settings.resolved_metadata_url() == "postgresql://u@h/db"
    assert settings.sources()["backend"] == "env SHOAL_BACKEND"
    assert settings.sources()["metadata_url"] == "argument"


def test_environment_values_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_MAX_SLOTS", "3")
    monkeypatch.setenv("SHOAL_LAUNCH_MODE", "spawn")
    monkeypatch.setenv("SHOAL_ARTIFACT_URL", "s3://b/p")
    settings = Settings()
    assert settings.max_slots == 3
    assert settings.launch_mode == "spawn"
    assert settings.resolved_artifact_url() == "s3://b/p"


@pytest.mark.parametrize(("var", "value", "field"), [
    ("SHOAL_MAX_SLOTS", "abc", "max_slots"),
    ("SHOAL_LAUNCH_MODE", "thread", "launch_mode"),
    ("SHOAL_LAUNCHER_IDLE_SECONDS", "soon", "launcher_idle_seconds"),
])
def test_bad_environment_value_names_the_field(monkeypatch: pytest.MonkeyPatch, var: str,
                                               value: str, field: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        Settings()
    assert field in str(info.value)
    assert "SHOAL_" in str(info.value)


def test_unknown_argument_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no_such_setting"):
        Settings(no_such_setting=1)


def test_settings_do_not_read_the_environment_at_import(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    first = Settings()
    monkeypatch.setenv("SHOAL_HOME", str(tmp_path / "other"))
    assert Settings().home == tmp_path / "other" != first.home


# --- defaults files -----------------------------------------------------------------------

def test_seed_file_loads_with_sources(tmp_path: Path) -> None:
    path = _write(tmp_path, "config.yaml", SEED)
    cfg = load_defaults([("user", path)])
    assert cfg.get("InstanceType") == "ml.m5.large"
    assert cfg.get("Dependencies") == "./requirements.txt"
    assert cfg.get("EnvironmentVariables") == {"EnvVarKey": "EnvVarValue"}
    assert cfg.get("Tags") == [{"Key": "someTagKey", "Value": "someTagValue"}]
    assert cfg.get("RoleArn", "unset") == "unset"
    for key in ("InstanceType", "Dependencies", "EnvironmentVariables", "Tags"):
        assert str(path) in cfg.remote_function[key].source
        assert "user" in cfg.remote_function[key].source
    assert cfg.files == (f"user:{path}",)


def test_missing_files_are_skipped(tmp_path: Path) -> None:
    cfg = load_defaults([("admin", tmp_path / "nope.yaml"), ("user", tmp_path / "no.yaml")])
    assert cfg.files == () and dict(cfg.remote_function) == {}


def test_missing_extra_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_defaults([("extra", tmp_path / "nope.yaml")])


def test_empty_file_is_fine(tmp_path: Path) -> None:
    cfg = load_defaults([("user", _write(tmp_path, "c.yaml", ""))])
    assert dict(cfg.remote_function) == {}


def test_user_file_overrides_admin_file_per_key(tmp_path: Path) -> None:
    admin = _write(tmp_path, "admin.yaml", _rf(
        "        InstanceType: ml.m5.large\n        Dependencies: ./admin-reqs.txt\n"))
    user = _write(tmp_path, "user.yaml", _rf("        InstanceType: ml.c5.xlarge\n"))
    cfg = load_defaults([("admin", admin), ("user", user)])
    assert cfg.get("InstanceType") == "ml.c5.xlarge"
    assert str(user) in cfg.remote_function["InstanceType"].source
    assert cfg.get("Dependencies") == "./admin-reqs.txt"
    assert str(admin) in cfg.remote_function["Dependencies"].source
    assert cfg.files == (f"admin:{admin}", f"user:{user}")


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.yaml", _rf("        InstanceType: [ml.m5.large\n"
                                            "        Tags: x\n"))
    with pytest.raises(ConfigError) as info:
        load_defaults([("user", path)])
    message = str(info.value)
    assert str(path) in message
    assert re.search(r"line \d+", message), message
    assert info.value.details["file"] == str(path)


def test_bad_yaml_line_number_is_right(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.yaml", "SchemaVersion: '1.0'\nSageMaker: {\n  a: b\n: :\n")
    with pytest.raises(ConfigError, match=r"line [34]\b"):
        load_defaults([("user", path)])


@pytest.mark.parametrize(("text", "key"), [
    (_rf("        InstanceTyp: ml.m5.large\n"),
     "SageMaker.PythonSDK.Modules.RemoteFunction.InstanceTyp"),
    ("SchemaVersion: '1.0'\nSageMakr: {}\n", "SageMakr"),
    ("SageMaker:\n  PythonSdk: {}\n", "SageMaker.PythonSdk"),
    ("SageMaker:\n  NotAResource: {}\n", "SageMaker.NotAResource"),
    ("SageMaker:\n  PythonSDK:\n    Modules:\n      RemoteFunctions: {}\n",
     "SageMaker.PythonSDK.Modules.RemoteFunctions"),
    ("SageMaker:\n  PythonSDK:\n    Modules:\n      Session:\n        Bucket: b\n",
     "SageMaker.PythonSDK.Modules.Session.Bucket"),
])
def test_unknown_key_names_the_full_path(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, "c.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_defaults([("user", path)])
    assert repr(key) in str(info.value)
    assert str(path) in str(info.value)
    assert info.value.details["key"] == key


@pytest.mark.parametrize(("body", "key", "expected"), [
    ("        InstanceType: 5\n", "InstanceType", "a string"),
    ("        Tags: {Key: a, Value: b}\n", "Tags", "list of"),
    ("        Tags:\n          - {Key: a}\n", "Tags", "list of"),
    ("        Tags:\n          - {Key: a, Value: 1}\n", "Tags", "list of"),
    ("        Tags:\n          - {Key: a, Value: b, Extra: c}\n", "Tags", "list of"),
    ("        IncludeLocalWorkDir: 'yes'\n", "IncludeLocalWorkDir", "true or false"),
    ("        EnvironmentVariables: {A: 1}\n", "EnvironmentVariables", "string to string"),
    ("        EnvironmentVariables: [A]\n", "EnvironmentVariables", "string to string"),
    ("        PreExecutionCommands: echo hi\n", "PreExecutionCommands", "list of strings"),
    ("        PreExecutionCommands: [1]\n", "PreExecutionCommands", "list of strings"),
    ("        CustomFileFilter: {Patterns: [x]}\n", "CustomFileFilter", "IgnoreNamePatterns"),
    ("        CustomFileFilter: {IgnoreNamePatterns: x}\n", "CustomFileFilter",
     "IgnoreNamePatterns"),
    ("        VpcConfig: {Subnets: subnet-1}\n", "VpcConfig", "Subnets"),
    ("        VpcConfig: {Other: []}\n", "VpcConfig", "Subnets"),
])
def test_wrong_type_names_key_and_expected_type(tmp_path: Path, body: str, key: str,
                                                expected: str) -> None:
    path = _write(tmp_path, "c.yaml", _rf(body))
    with pytest.raises(ConfigError) as info:
        load_defaults([("user", path)])
    message = str(info.value)
    assert f"SageMaker.PythonSDK.Modules.RemoteFunction.{key}" in message
    assert expected in message
    assert str(path) in message


@pytest.mark.parametrize(("text", "key"), [
    ("- a\n- b\n", "(top level)"),
    ("SchemaVersion: '2.0'\n", "SchemaVersion"),
    ("SageMaker: [1]\n", "SageMaker"),
    ("SageMaker:\n  PythonSDK:\n    Modules: [1]\n", "SageMaker.PythonSDK.Modules"),
    (_rf("        - InstanceType\n"), "SageMaker.PythonSDK.Modules.RemoteFunction"),
])
def test_wrong_shape_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = _write(tmp_path, "c.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_defaults([("user", path)])
    assert key in str(info.value)


def test_full_sagemaker_config_sets_every_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "full.yaml", FULL)
    cfg = load_defaults([("admin", path)])
    assert set(cfg.remote_function) == set(REMOTE_FUNCTION_KEYS)
    assert len(REMOTE_FUNCTION_KEYS) == 16
    assert cfg.get("VpcConfig") == {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1",
                                                                             "subnet-2"]}
    assert cfg.get("EnableInterContainerTrafficEncryption") is True
    assert {k: v.value for k, v in cfg.session.items()} == {
        "DefaultS3Bucket": "my-bucket", "DefaultS3ObjectKeyPrefix": "some/prefix"}
    assert all(str(path) in v.source for v in cfg.remote_function.values())


def test_unreadable_config_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "dir.yaml"
    path.mkdir()
    with pytest.raises(ConfigError, match="dir.yaml"):
        load_defaults([("user", path)])


# --- who reads the environment ------------------------------------------------------------

#: Modules that may read os.environ: settings, and code that starts processes with an
#: explicit environment (the in-job entry point, the job driver and the backends).
# Besides config.py, only code that builds a child process's environment, or is the entry
# point of one (the supervisor in jobs/worker.py and session.py, the job's own process),
# touches os.environ.
ENV_READERS_ALLOWED = ("config.py", "jobs/_entrypoint.py", "jobs/driver.py", "jobs/_process.py",
                       "jobs/worker.py",
                       "jobs/_zygote.py", "jobs/_executor.py", "jobs/_child.py", "session.py", "envs/_uv.py",
                       "envs/_conda.py",
                       "backends/",
                       # a user's training script that the demo ships as data and runs as a job
                       "cli/demo_assets/",
                       # the demo's user code: a SageMaker train.py as text, a @remote function
                       # that prints its own secret variable (each runs as a job)
                       "cli/_demo_sagemaker.py", "cli/_demo_security.py",
                       # rich's own terminal variables (TTY_COMPATIBLE, FORCE_COLOR), read
                       # to tell whether to import rich at all (not shoal settings)
                       "_internal/logconfig.py")
_ENV_USE = re.compile(r"\bos\.(environ|getenv)\b|\bfrom\s+os\s+import\b[^\n]*\b(environ|getenv)\b")


def test_only_allowed_modules_read_the_environment() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "config.py" or rel in ENV_READERS_ALLOWED or any(
                rel.startswith(d) for d in ENV_READERS_ALLOWED if d.endswith("/")):
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _ENV_USE.search(line):
                offenders.append(f"src/shoal/{rel}:{lineno}: {line.strip()}")
    assert not offenders, ("read settings through shoal.config.Settings instead:\n"
                           + "\n".join(offenders))
