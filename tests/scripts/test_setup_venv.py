"""`scripts/setup_venv.sh` refuses to start a venv that the disk cannot hold: `df` and `stat` are
stubbed on PATH (a full disk cannot be made here), the rest of the script runs as written."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_venv.sh"


def _run(tmp_path: Path, free_bytes: int, free_bytes_for_downloads: int | None = None):
    """The script with `free_bytes` free where the venv goes; with `free_bytes_for_downloads`, TMPDIR is
    on a filesystem of its own with that much free."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    own_filesystem = free_bytes_for_downloads is not None
    downloads_free = free_bytes_for_downloads if own_filesystem else free_bytes
    # df -P -B1 PATH: a header and one line whose fourth field is the free space.
    downloads = tmp_path / "downloads"
    (stubs / "df").write_text(
        '#!/bin/sh\necho "Filesystem 1-blocks Used Available Capacity Mounted"\n'
        f'if [ "$3" = "{downloads}" ]; then free={downloads_free}; else free={free_bytes}; fi\n'
        'echo "/dev/x 1 1 $free 1% /"\n')
    # stat -c %d PATH: the device number.
    (stubs / "stat").write_text(f'#!/bin/sh\nif [ "$3" = "{downloads}" ]; then echo {2 if own_filesystem else 1}; '
                                'else echo 1; fi\n')
    # No Python 3.12 to be found: a start that passes the space check stops at that message instead.
    (stubs / "python3.12").write_text("#!/bin/sh\nexit 1\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    downloads.mkdir()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(downloads),
           "NEMO_TOPR_VENV": str(tmp_path / "envs" / "venv")}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def test_a_disk_without_room_for_the_venv_and_its_downloads_is_refused_before_anything_is_made(tmp_path):
    # 10 GB holds the venv (8.2) but not the venv and pip's downloads (4.3) on one filesystem.
    result = _run(tmp_path, 10_000_000_000)
    assert result.returncode == 1
    assert (f"setup_venv: {tmp_path}/envs/venv (8.2 GB) and pip's downloads in {tmp_path}/downloads (4.3 GB) "
            f"need about 12.5 GB free; {tmp_path}/envs has 10.0 GB.") in result.stderr
    assert "NEMO_TOPR_VENV" in result.stderr
    assert not (tmp_path / "envs" / "venv").exists()


def test_room_enough_lets_the_setup_go_on(tmp_path):
    result = _run(tmp_path, 12_500_000_000)
    assert "need about" not in result.stderr
    assert result.returncode == 1 and "no Python 3.12 found" in result.stderr


def test_downloads_on_another_filesystem_are_counted_there(tmp_path):
    for case in ("fits", "venv", "downloads"):
        (tmp_path / case).mkdir()
    # 9 GB where the venv goes, 5 GB for the downloads: each fits its own filesystem.
    assert "no Python 3.12 found" in _run(tmp_path / "fits", 9_000_000_000, 5_000_000_000).stderr
    venv_short = _run(tmp_path / "venv", 8_000_000_000, 5_000_000_000)
    assert venv_short.returncode == 1
    assert (f"{tmp_path}/venv/envs/venv need about 8.2 GB free; {tmp_path}/venv/envs has 8.0 GB."
            in venv_short.stderr)
    downloads_short = _run(tmp_path / "downloads", 9_000_000_000, 4_000_000_000)
    assert downloads_short.returncode == 1
    assert (f"pip's downloads in {tmp_path}/downloads/downloads need about 4.3 GB free; "
            f"{tmp_path}/downloads/downloads has 4.0 GB." in downloads_short.stderr)
    assert not any((tmp_path / case / "envs" / "venv").exists() for case in ("venv", "downloads"))
