"""The built wheel installs beside proto-plus and works from its own virtualenv.

kq's packages used to be nine generic top-level modules (`proto` among them, the import name of
proto-plus); the wheel must now hold `kq` alone, with `kq.spark.jobs` and the `.proto` file, and its
scripts must run a node and the CLI without the checkout on the path.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from kq.deploy.cluster import LocalCluster
from tests.system.wheels import INSTALL_TIMEOUT_S, build_wheel, copy_checkout, run_outside, venv_with_wheel

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of this checkout (with the build tools of the test's own environment)."""
    out = tmp_path_factory.mktemp("wheel")
    return build_wheel(copy_checkout(out / "source"), out)


def test_the_wheel_holds_one_namespace_with_jobs_and_proto(wheel: Path) -> None:
    """Every file is under `kq/` (or the dist-info), but `pyspark_kq.py`, the one module Spark looks for
    to register format("kq") by itself; the Spark jobs, the .proto and the harness are in."""
    names = zipfile.ZipFile(wheel).namelist()
    top_levels = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_levels == {"kq", "pyspark_kq.py"}
    for needed in (
        "kq/proto/kq.proto",
        "kq/proto/limits.py",
        "kq/proto/errors.py",
        "kq/spark/jobs/key_minute_stats.py",
        "kq/spark/sink.py",
        "kq/deploy/cluster.py",
        "kq/client/__init__.py",
        "kq/py.typed",
    ):
        assert needed in names, f"{needed} is missing from the wheel"


def test_the_wheel_installs_beside_proto_plus_and_serves(wheel: Path, tmp_path: Path) -> None:
    """From a virtualenv of its own with proto-plus: kq --help, both imports, one produce and consume.

    The virtualenv sees the test environment's packages after its own (`venv_with_wheel`), as the
    rolling upgrade's does: installing kq's dependencies from the index took most of a minute of the
    default run. `pip check` then holds the wheel's declared requirements to what is installed."""
    venv = tmp_path / "venv"
    outside = tmp_path / "elsewhere"  # Not the checkout: its kq/ folder must not be importable.
    outside.mkdir()
    pip = venv_with_wheel(wheel, venv, outside)
    bin_dir = venv / "bin"
    run_outside([*pip, "install", "--quiet", "proto-plus"], cwd=outside, timeout_s=INSTALL_TIMEOUT_S)
    run_outside([*pip, "check"], cwd=outside)
    assert "topics" in run_outside([str(bin_dir / "kq"), "--help"], cwd=outside)
    where = run_outside(
        [
            str(bin_dir / "python"),
            "-c",
            "import kq.client, proto; print(kq.client.__file__); print(proto.Message)",
        ],
        cwd=outside,
    ).splitlines()
    assert where[0].startswith(str(venv)), f"kq.client came from {where[0]}, not the wheel"
    assert "proto.message.Message" in where[1]  # proto-plus's own `proto`, not a kq module.

    with LocalCluster(tmp_path / "cluster", size=1, node_command=[str(bin_dir / "kq-node")]) as cluster:
        bootstrap = ",".join(cluster.bootstrap)
        kq = [str(bin_dir / "kq"), "--bootstrap", bootstrap]
        run_outside([*kq, "topics", "create", "wheel", "--partitions", "1"], cwd=outside)
        run_outside([*kq, "produce", "wheel", "from-the-wheel"], cwd=outside)
        consumed = run_outside([*kq, "consume", "wheel", "--from-beginning", "--max", "1"], cwd=outside)
    assert "from-the-wheel" in consumed
