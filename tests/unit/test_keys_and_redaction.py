"""The user's secret file, the keys derived from it, sealed variables and the streaming
redactor (issue #15.1, #15.2)."""

from __future__ import annotations

import os
import stat

import pytest

from shoal.config import Settings
from shoal.core.secrets import StreamRedactor, mask_text, without_credentials
from shoal.errors import ConfigError, PayloadIntegrityError
from shoal.jobs.keys import UserKeys, encode_handover, load_user_secret, take_handover
from shoal.serialization.keys import (
    SEALED_PREFIX,
    job_secret,
    new_salt,
    open_env,
    payload_key,
    seal_env,
)

# --- the user's secret --------------------------------------------------------------------


def test_the_secret_is_created_once_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    path = Settings().user_secret_path()
    assert path == tmp_path / "cfg" / "shoal" / "user-secret"
    first = load_user_secret(path)
    assert len(first) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_user_secret(path) == first  # read, not made again


def test_shoal_user_secret_file_overrides_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_USER_SECRET_FILE", str(tmp_path / "elsewhere" / "key"))
    assert Settings().user_secret_path() == tmp_path / "elsewhere" / "key"


def test_a_secret_others_may_read_is_refused(tmp_path):
    path = tmp_path / "user-secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        load_user_secret(path)
    assert str(path) in str(info.value) and "0644" in str(info.value)
    assert f"chmod 600 {path}" in str(info.value)


def test_a_secret_of_the_wrong_size_is_refused(tmp_path):
    path = tmp_path / "user-secret"
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=rf"{path} holds 5 bytes, not 32"):
        load_user_secret(path)


# --- derived keys -------------------------------------------------------------------------


def test_keys_differ_per_job_salt_and_user():
    alice, bob = os.urandom(32), os.urandom(32)
    salt = new_salt()
    a = job_secret(alice, "job-a", salt)
    assert a == job_secret(alice, "job-a", salt)  # derived again, the same
    others = {job_secret(alice, "job-b", salt), job_secret(alice, "job-a", new_salt()),
              job_secret(bob, "job-a", salt)}
    assert a not in others and len(others) == 3
    assert payload_key(a) != a and len(bytes.fromhex(payload_key(a))) == 32


def test_user_keys_reads_the_file_once(tmp_path):
    keys = UserKeys(tmp_path / "s")
    salt = new_salt()
    assert keys.secret("j", salt) == job_secret((tmp_path / "s").read_bytes(), "j", salt)


def test_the_handover_is_taken_out_of_the_environment():
    env = {"SHOAL_JOB_SECRETS": encode_handover({"j": "ab" * 32}), "OTHER": "1"}
    assert take_handover(env) == {"j": "ab" * 32}
    assert env == {"OTHER": "1"}
    assert take_handover(env) == {}


# --- sealed variables ---------------------------------------------------------------------


def test_secret_looking_values_are_sealed_and_open_again():
    secret = job_secret(os.urandom(32), "job", new_salt())
    env = {"DB_PASSWORD": "hunter2", "PLAIN": "visible"}
    sealed = seal_env(env, secret, "job")
    assert sealed["PLAIN"] == "visible"
    assert sealed["DB_PASSWORD"].startswith(SEALED_PREFIX) and "hunter2" not in sealed["DB_PASSWORD"]
    assert open_env(sealed, secret, "job") == env
    with pytest.raises(PayloadIntegrityError, match="DB_PASSWORD of job other"):
        open_env(sealed, secret, "other")  # bound to its job: not moved to another
    with pytest.raises(PayloadIntegrityError):
        open_env(sealed, job_secret(os.urandom(32), "job", new_salt()), "job")


# --- the streaming redactor ---------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_a_value_split_anywhere_never_passes(size):
    secrets = ("s3cr3t-value-0123", "tok-987654")
    text = b"start s3cr3t-value-0123 middle tok-987654\nend s3cr3t-valu"
    redactor = StreamRedactor(secrets)
    out = b"".join(redactor.feed(text[i:i + size]) for i in range(0, len(text), size))
    out += redactor.flush()
    assert out == b"start **** middle ****\nend s3cr3t-valu"


def test_ordinary_output_is_not_held_back():
    redactor = StreamRedactor(["s3cr3t-value"])
    assert redactor.feed(b"epoch 1 done\n") == b"epoch 1 done\n"
    assert redactor.feed(b"loss s3") == b"loss "  # might start the value: held
    assert redactor.feed(b"x\n") == b"s3x\n"


def test_mask_text_masks_the_longest_first():
    assert mask_text("a abcdef b abc", ["abc", "abcdef"]) == "a **** b ****"


def test_the_values_a_job_sees_include_its_clients_secrets():
    from shoal.jobs.keys import secret_values_seen

    seen = secret_values_seen({"DB_PASSWORD": "pw12", "PLAIN": "visible"},
                              {"GITHUB_TOKEN": "ghp-0123456789", "FOO_TOKEN": "true",
                               "SHOAL_JOB_SECRETS": "{}", "HOME": "/root"})
    assert seen == ("ghp-0123456789", "pw12")  # an inherited "true" would mask every "true"


# --- what a team server's endpoints withhold ----------------------------------------------


def test_credentials_are_withheld_and_the_rest_kept():
    env = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SESSION_TOKEN": "t", "PGPASSWORD": "p",
           "PGPASSFILE": "/home/srv/.pgpass", "HF_TOKEN": "hf", "DB_SECRET": "s",
           "GOOGLE_APPLICATION_CREDENTIALS": "/srv/key.json", "AZURE_STORAGE_KEY": "a",
           "REPORTS_URL": "postgresql://svc:pw@db/reports", "PATH": "/usr/bin",
           "HOME": "/home/srv", "DOCS_URL": "https://example.org/docs", "OMP_NUM_THREADS": "1"}
    assert without_credentials(env) == {"PATH": "/usr/bin", "HOME": "/home/srv",
                                        "DOCS_URL": "https://example.org/docs",
                                        "OMP_NUM_THREADS": "1"}
