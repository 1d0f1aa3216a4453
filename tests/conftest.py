"""Suite-wide settings: no per-example deadline for property tests (the CI machine is shared and slow);
gRPC fork support off (see below)."""

import os

# Before any test imports grpc: the Spark tests fork the JVM from this process while other tests'
# gRPC channels are alive, and grpcio's fork handlers made that child die now and then (see
# spark/__init__.py). Nothing here uses gRPC in a forked child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from hypothesis import settings

settings.register_profile("kq", deadline=None, print_blob=True)
settings.load_profile("kq")
