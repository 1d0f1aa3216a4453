"""Suite-wide settings: no per-example deadline for property tests (the CI machine is shared and slow);
gRPC fork support off (see below); kq's modules compiled once (`pytest_sessionstart`)."""

import compileall
import os
from pathlib import Path

import pytest

# Before any test imports grpc: the Spark tests fork the JVM from this process while other tests'
# gRPC channels are alive, and grpcio's fork handlers made that child die now and then (see
# spark/__init__.py). Nothing here uses gRPC in a forked child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from hypothesis import settings

settings.register_profile("kq", deadline=None, print_blob=True)
settings.load_profile("kq")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Writes the bytecode of kq's modules before any test starts a node. Where PYTHONDONTWRITEBYTECODE
    is set (this project's machines set it), Python reads `__pycache__` but never writes it, so every
    node, CLI and Spark worker process the suite starts compiled kq's ~250 modules from source again:
    ~0.4 s of CPU a process, several hundred processes a run. Files already compiled are skipped."""
    import kq

    package = Path(kq.__file__).parent
    compileall.compile_file(package / "__init__.py", quiet=1)
    for part in package.iterdir():  # Links to the repository's folders, which compile_dir steps over.
        if part.is_dir() and part.name != "__pycache__":
            compileall.compile_dir(part.resolve(), quiet=1)
