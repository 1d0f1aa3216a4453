"""Regenerates the Python code for `proto/kq.proto` and `proto/raft.proto` (the Raft transport's
frames, no service); `--check` fails when the committed code is stale.

Run from the project root: `python -m kq.proto.generate` (write) or `python -m kq.proto.generate --check`.
The generator versions are pinned in pyproject's `dev` extra so the output is reproducible.
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # The mypy-protobuf plugins live beside the interpreter.
GENERATED = ("kq_pb2.py", "kq_pb2.pyi", "kq_pb2_grpc.py", "kq_pb2_grpc.pyi", "raft_pb2.py", "raft_pb2.pyi")


def generate(output_root: Path) -> None:
    """Runs protoc with the Python, gRPC and mypy plugins, writing under `output_root/kq/proto/`.

    The .proto is named by its path in the `kq` namespace (`kq/proto/kq.proto`, through the checkout's
    `kq/proto` symlink), so the generated modules import each other as `kq.proto.*`.
    """
    (output_root / "kq" / "proto").mkdir(parents=True, exist_ok=True)
    arguments = [
        "protoc",
        f"-I{ROOT}",
        f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
        f"--python_out={output_root}",
        f"--grpc_python_out={output_root}",
        f"--mypy_out={output_root}",
        f"--mypy_grpc_out={output_root}",
        str(ROOT / "kq" / "proto" / "kq.proto"),
    ]
    if protoc.main(arguments) != 0:
        raise SystemExit("protoc failed")
    raft_arguments = [  # No service in it: no gRPC stubs.
        "protoc",
        f"-I{ROOT}",
        f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
        f"--python_out={output_root}",
        f"--mypy_out={output_root}",
        str(ROOT / "kq" / "proto" / "raft.proto"),
    ]
    if protoc.main(raft_arguments) != 0:
        raise SystemExit("protoc failed")


def main(argv: list[str]) -> int:
    """Writes the generated files, or with `--check` compares them with freshly generated ones."""
    if "--check" not in argv:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        generate(Path(scratch))
        stale = [
            name
            for name in GENERATED
            if not (ROOT / "proto" / name).exists()
            or not filecmp.cmp(Path(scratch) / "kq" / "proto" / name, ROOT / "proto" / name, shallow=False)
        ]
    if stale:
        print(f"generated code is stale: {', '.join(stale)}; run: python -m kq.proto.generate")
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
