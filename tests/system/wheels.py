"""kq's wheel built from a source tree and installed into a virtualenv of its own: for the wheel test
(this checkout) and the rolling upgrade test (an older commit, `release_venv`).

Commands run in an environment that does not point at the checkout (no PYTHONPATH), from a folder
outside it, so what they import is what was installed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600.0  # Dependencies come from PyPI (or pip's cache): minutes on a cold cache.
COMMAND_TIMEOUT_S = 120.0
# Not part of a source tree: environments, caches, earlier builds, run directories.
SOURCE_IGNORED = (".git", ".venv", "build", "run", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis")
# What `release_venv` writes last into a finished virtualenv: what it was built from and against.
RELEASE_STAMP = "kq-release.json"
# The one file a release's virtualenv adds to its site-packages: the test environment's packages,
# searched after the release's own (a path line of a .pth file is appended to sys.path).
DEPENDENCIES_PTH = "kq-test-dependencies.pth"


def run_outside(command: list[str], cwd: Path, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Runs `command` in `cwd` with an environment that does not point at the checkout; its stdout."""
    environment = {
        key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "KQ_BOOTSTRAP")
    }
    completed = subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert completed.returncode == 0, (
        f"{' '.join(command)} exited {completed.returncode}\n{completed.stdout}\n{completed.stderr}"
    )
    return completed.stdout


def copy_checkout(destination: Path) -> Path:
    """This checkout's source tree, copied to `destination` (setuptools leaves build/ in the tree it
    builds, and a file deleted from the checkout but still in an old build/ would end up in a wheel)."""
    shutil.copytree(REPO, destination, symlinks=True, ignore=shutil.ignore_patterns(*SOURCE_IGNORED))
    return destination


def archive_commit(commit: str, destination: Path) -> Path:
    """The source tree of `commit` (`git archive`), extracted into `destination`."""
    destination.mkdir(parents=True)
    archive = destination.with_name(destination.name + ".tar")
    run_outside(["git", "-C", str(REPO), "archive", "--format=tar", f"--output={archive}", commit], REPO)
    with tarfile.open(archive) as tar:
        tar.extractall(destination, filter="tar")  # The archive's kq/ symlinks point inside it.
    archive.unlink()
    return destination


def build_wheel(source: Path, out: Path) -> Path:
    """kq's wheel built from `source` into `out` (with the build tools of the test's own environment)."""
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out)]
    run_outside([*pip_wheel, str(source)], cwd=out, timeout_s=INSTALL_TIMEOUT_S)
    (built,) = out.glob("kq_broker-*.whl")
    return built


def commit_hash(revision: str) -> str:
    """The full hash of `revision` in this checkout."""
    return run_outside(["git", "-C", str(REPO), "rev-parse", f"{revision}^{{commit}}"], REPO).strip()


def release_venv(commit: str, cache_dir: Path) -> Path:
    """A virtualenv holding kq's wheel of `commit` (a full hash), built under `cache_dir` once and
    reused while it stamps the same commit, interpreter and dependencies.

    Installing the release's dependencies would take minutes and the network: the virtualenv sees the
    test environment's packages instead, after its own (`DEPENDENCIES_PTH`), so its `kq` is the
    release's and everything else is this environment's. That holds while the release's dependencies
    are ones this environment satisfies (the caller's check that a node starts tells otherwise).
    Its `bin/kq-node` runs a node of the release: a script does not put the working folder on
    sys.path (as `python -m` would, where a checkout's `kq/` would win).
    """
    dependencies = sysconfig.get_path("purelib")
    stamp = {"commit": commit, "python": sys.version, "dependencies": dependencies}
    venv = cache_dir / f"kq-{commit[:12]}-py{sys.version_info.major}{sys.version_info.minor}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Built where it stays (its scripts name their interpreter by path), by one run at a time.
    with (cache_dir / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _stamped(venv, stamp):
            shutil.rmtree(venv, ignore_errors=True)  # Unfinished, or of another interpreter.
            _build_release_venv(commit, venv)
            (venv / RELEASE_STAMP).write_text(json.dumps(stamp))  # Last: the virtualenv is finished.
    return venv


def _build_release_venv(commit: str, venv: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="kq-release-") as building:
        work = Path(building)
        wheel = build_wheel(archive_commit(commit, work / "source"), _made(work / "wheel"))
        venv_with_wheel(wheel, venv, work)


def venv_with_wheel(wheel: Path, venv: Path, work: Path) -> list[str]:
    """Makes `venv` hold `wheel` alone, and see the test environment's packages after its own
    (`DEPENDENCIES_PTH`: installing kq's dependencies would take minutes and the network); returns the
    pip command that installs into it (this environment's pip, `--python` the virtualenv's)."""
    run_outside([sys.executable, "-m", "venv", "--without-pip", str(venv)], work)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    run_outside([*pip, "install", "--quiet", "--no-deps", "--no-index", str(wheel)], work, INSTALL_TIMEOUT_S)
    site_packages = Path(run_outside([str(python), "-c", _PURELIB], work).strip())
    (site_packages / DEPENDENCIES_PTH).write_text(f"{sysconfig.get_path('purelib')}\n")
    return pip


_PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"


def _made(directory: Path) -> Path:
    directory.mkdir()
    return directory


def _stamped(venv: Path, stamp: dict[str, str]) -> bool:
    """Whether `venv` is a finished virtualenv built from what `stamp` names."""
    try:
        return bool(json.loads((venv / RELEASE_STAMP).read_text()) == stamp)
    except (OSError, ValueError):
        return False
