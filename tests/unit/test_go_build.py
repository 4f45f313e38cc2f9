"""hack/go-build.sh warns before compiling when the disk the build needs is not free; hack/go-module-files.sh copies
a module's files into bin/.

A cold build of the control plane fills about 3.5 GiB of build cache; a CI
machine once ran out of disk halfway through it, with nothing but the
compiler's "no space left on device" to say why. The script is run here with
a stand-in Go toolchain (two packages not in the cache, one in it) and a
stand-in ``df`` that reports the free space the test chooses, in a copy of
the script (and of hack/go-env.sh, which it sources) so that its caches and
output go to the test's folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GO = """#!/bin/sh
case "$1" in
  list) printf 'true example.com/a\\ntrue example.com/b\\nfalse example.com/c\\n' ;;
  env) echo go0.0-stand-in ;;
  build) for arg; do [ "$previous" = -o ] && mkdir -p "$(dirname "$arg")" && : > "$arg"; previous=$arg; done ;;
esac
"""
DF = """#!/bin/sh
echo "Filesystem 1048576-blocks Used Available Capacity Mounted on"
echo "stand-in 100000 0 $FREE_MIB 0% /"
"""


def _run(tmp_path: Path, script: str, *args: str, go: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a copy of hack/``script`` (with hack/go-env.sh, which it sources) in ``tmp_path`` on ``go``, a stand-in."""
    (tmp_path / "hack").mkdir(exist_ok=True)
    for name in (script, "go-env.sh"):
        shutil.copy(ROOT / "hack" / name, tmp_path / "hack" / name)
    (tmp_path / "module").mkdir(exist_ok=True)
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for name, text in (("go", go), ("df", DF)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    env = {**os.environ, "GO": str(tools / "go"), "PATH": f"{tools}:{os.environ['PATH']}", "TMPDIR": str(tmp_path),
           **env}
    env.pop("GOTMPDIR", None)
    return subprocess.run(["bash", str(tmp_path / "hack" / script), "module", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def _build(tmp_path: Path, free_mib: int) -> subprocess.CompletedProcess[str]:
    return _run(tmp_path, "go-build.sh", ".", "bin/program", go=GO, FREE_MIB=str(free_mib))


@pytest.mark.parametrize("free_mib", [1, 301])
def test_too_little_free_disk_is_said_before_compiling_and_the_build_still_runs(tmp_path: Path, free_mib: int) -> None:
    result = _build(tmp_path, free_mib)
    # two packages to compile (2 MiB of cache at 1.4 MiB each) and a batch's work folder (300 MiB), on one disk
    assert (f"go-build: warning: program needs about 302 MiB free on the disk of {tmp_path}/.cache/gobuild (2 "
            f"packages to compile), {free_mib} MiB are free") in result.stderr
    assert result.stdout.index("resolving packages") < result.stdout.index("compiling with go0.0-stand-in")
    assert result.returncode == 0 and (tmp_path / "bin" / "program").exists(), result.stderr


def test_enough_free_disk_says_nothing(tmp_path: Path) -> None:
    result = _build(tmp_path, 302)
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


def test_a_module_s_files_are_copied_into_bin_from_the_module_cache(tmp_path: Path) -> None:
    """hack/go-module-files.sh (prometheus-operator's CRDs for the tests): the files of the module version `go list
    -m` names, copied writable (the module cache's are read-only) so that the next run can replace them; a file the
    module lacks fails the run."""
    published = tmp_path / ".cache" / "gomod" / "example.com" / "crds@v1.0.0" / "examples"
    published.mkdir(parents=True)
    (published / "a.yaml").write_text("kind: A\n")
    (published / "a.yaml").chmod(0o444)
    go = f"#!/bin/sh\n[ \"$1\" = list ] && echo {published.parent}\nexit 0\n"
    for _ in range(2):
        result = _run(tmp_path, "go-module-files.sh", "example.com/crds", "examples", "bin/crds/a.yaml", go=go)
        assert result.returncode == 0, result.stderr
    copied = tmp_path / "bin" / "crds" / "a.yaml"
    assert copied.read_text() == "kind: A\n" and copied.stat().st_mode & 0o777 == 0o644
    lacking = _run(tmp_path, "go-module-files.sh", "example.com/crds", "examples", "bin/crds/b.yaml", go=go)
    assert lacking.returncode != 0 and not (tmp_path / "bin" / "crds" / "b.yaml").exists()
