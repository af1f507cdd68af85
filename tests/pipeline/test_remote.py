"""Habit 3 with real dvc: push a trained project to a remote, clone it fresh, pull, and find nothing to
rerun. Once with a local-folder remote and once through a real sshd on loopback (dvc-ssh, key auth)."""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.pipeline.project import ran_stages, run

pytestmark = pytest.mark.slow
UP_TO_DATE = "Data and pipelines are up to date."
# What a teammate needs to reuse the run without retraining: every cached out, checkpoints included.
PULLED = ["models/base/config.json", "data/prepared/train.jsonl", "data/sent/scores.jsonl",
          "data/sent_progress/progress.json", "models/final/adapter_model.safetensors",
          "models/best/SELECTION.json", "eval/best/gsm8k.jsonl", "reports/report.md"]


def push_clone_pull(project: Path, workdir: Path, *remote_setup: str, local_setup: tuple[str, ...] = ()) -> Path:
    """Add the remote (committed), push data and run cache, clone with git into ``workdir``, pull: the
    README's steps, its commands verbatim. Returns the clone."""
    for command in remote_setup:
        run(command, project)
    for command in local_setup:
        run(command, project)
    run(["git", "commit", "-qm", "remote", ".dvc/config"], project)
    pushed = run("dvc push", project)
    assert "pushed" in pushed.stdout
    run("dvc push --run-cache", project)
    run('git clone "$REPO_URL" grpo-dvc && cd grpo-dvc', workdir, REPO_URL=str(project))
    clone = workdir / "grpo-dvc"
    for command in local_setup:  # credentials live in .dvc/config.local: each user sets their own
        run(command, clone)
    run("dvc pull", clone)
    return clone


def assert_clean_clone(project: Path, clone: Path) -> None:
    status = run("dvc status", clone)
    assert status.stdout.strip() == UP_TO_DATE, status.stdout
    assert ran_stages(run("dvc repro", clone).stdout) == []
    for rel in PULLED:
        assert (clone / rel).read_bytes() == (project / rel).read_bytes(), rel
    checkpoints = sorted(p.name for p in (clone / "models/checkpoints").iterdir())
    assert checkpoints == sorted(p.name for p in (project / "models/checkpoints").iterdir()) and checkpoints


def test_local_remote_push_clone_pull(project_copy, tmp_path):
    storage = tmp_path / "dvc-storage"
    clone = push_clone_pull(project_copy, tmp_path, f"dvc remote add -d storage {storage}")
    assert (storage / "files" / "md5").is_dir()
    assert (storage / "runs").is_dir(), "dvc push --run-cache pushed no run cache"
    assert_clean_clone(project_copy, clone)


# --- a real sshd on loopback ------------------------------------------------------------------


def _sshd_binary() -> str | None:
    return shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(p, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    """sshd (Debian's openssh-server) on 127.0.0.1 with a throwaway host key and one authorised client
    key; `.ci/run` installs it. Skips only when sshd is missing and CI did not ask for it."""
    binary = _sshd_binary()
    if binary is None:
        if os.environ.get("GRPO_REQUIRE_SSHD"):
            pytest.fail("GRPO_REQUIRE_SSHD is set but sshd is not installed (apt-get install openssh-server)")
        pytest.skip("sshd is not installed (Debian: apt-get install openssh-server; .ci/run does this)")
    d = tmp_path / "sshd"
    d.mkdir()
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_key'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}", f"PidFile {d / 'sshd.pid'}",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",
        "Subsystem sftp internal-sftp", "LogLevel ERROR", ""]))
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen([binary, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited ({proc.returncode}): {proc.stderr.read()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("sshd did not listen within 20 s")
                time.sleep(0.2)
        yield {"port": port, "user": getpass.getuser(), "key": d / "client_key"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_ssh_remote_push_clone_pull(project_copy, tmp_path, sshd):
    storage = tmp_path / "ssh-storage"
    url = f"ssh://{sshd['user']}@127.0.0.1:{sshd['port']}{storage}"
    clone = push_clone_pull(
        project_copy, tmp_path,
        f"dvc remote add -d storage {url}",
        local_setup=(f"dvc remote modify --local storage keyfile {sshd['key']}",),
    )
    assert (storage / "files" / "md5").is_dir(), "nothing arrived through sshd"
    assert (storage / "runs").is_dir()
    assert_clean_clone(project_copy, clone)
