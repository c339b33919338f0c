"""The README's Python examples run as written (LitServe's test_readme habit), each on the
install its first line names (``# pip install "shoal[torch,serve]"``): the wheel with those
extras in a fresh venv (tests/installs.py), from a directory outside the checkout. Each runs
twice in the same directory and home, so an example that cannot be re-run fails."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from installs import run_python, user_env, venv

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
_INSTALL = re.compile(r'# pip install (?:shoal|"shoal\[([a-z0-9_,-]+)\]")\s*$')

#: What each example prints, by a phrase of its code: the proof it ran, not only exited 0.
EXPECTED = {
    "def divide": ("0.6666666666666666", "[0, 1, 4, 9]"),
    "Estimator(entry_point": ("/output/model.tar.gz",),
    "export(net": ("ok: max abs error", "(2, 10)"),
}


def _blocks() -> list[tuple[str, str]]:
    """(extras, code) per python block; a block without its install line is an error."""
    out = []
    for code in _BLOCK.findall(README.read_text(encoding="utf-8")):
        first = code.splitlines()[0] if code.strip() else ""
        found = _INSTALL.match(first)
        assert found, f"a README python block must start with its install line " \
                      f"('# pip install shoal' or '# pip install \"shoal[x]\"'): {first!r}"
        out.append((found.group(1) or "", code))
    return out


def test_every_python_block_says_which_install_it_runs_on():
    blocks = _blocks()
    assert len(blocks) >= 3
    assert {extras for extras, _ in blocks} >= {"", "torch,serve"}
    phrases = [p for p in EXPECTED if not any(p in code for _, code in blocks)]
    assert not phrases, f"EXPECTED names examples the README no longer has: {phrases}"


@pytest.mark.slow
@pytest.mark.timeout(900)  # may build its venv first; the ONNX example deploys twice
@pytest.mark.parametrize("index", range(len(_BLOCK.findall(README.read_text()))))
def test_readme_python_example_runs_twice_on_its_install(index: int, tmp_path: Path):
    extras, code = _blocks()[index]
    env_dir = venv(extras)
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    env = user_env(tmp_path)
    expected = next((v for k, v in EXPECTED.items() if k in code), ())
    try:
        for attempt in (1, 2):
            proc = run_python(env_dir, script, tmp_path, env=env, timeout=300)
            output = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"run {attempt} on shoal[{extras}]:\n{output}"
            for phrase in expected:
                assert phrase in proc.stdout, f"run {attempt}: {phrase!r} not in:\n{output}"
    finally:
        run_python(env_dir, "import shoal; shoal.Session().backend.shutdown_launcher()",
                   tmp_path, env=env, timeout=60)


_TEAM = re.compile(r"## For a team.*?```bash\n(.*?)```", re.S)


@pytest.mark.slow
@pytest.mark.timeout(900)  # may build the server extra's venv first
def test_readme_team_block_runs_as_written(tmp_path: Path):
    """The "For a team" shell block, on the ``shoal[server]`` install: its only edits are
    the install line (the venv is that install) and the port (a free one, so two runs on a
    machine never meet)."""
    import os
    import signal
    import socket
    import subprocess

    code = _TEAM.search(README.read_text(encoding="utf-8")).group(1)
    first, _, rest = code.partition("\n")
    assert first.startswith('pip install "shoal[server]"'), first
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert rest.count("8765") >= 3  # where it serves and where alice connects
    script = tmp_path / "team.sh"
    script.write_text(rest.replace("8765", str(port)))
    env_dir = venv("server")
    env = user_env(tmp_path, PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(["bash", "-e", str(script)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the server too, should the block stop early
    assert proc.returncode == 0, output
    home = tmp_path / "shoal-home"
    assert f"ran under {home}" in output, output  # the job ran under the server's home
    assert re.search(r"^first\b.*completed", output, re.M | re.I), output  # the run, read back
    assert re.search(r"^where-\S+\s+completed", output, re.M), output  # shoal jobs list
