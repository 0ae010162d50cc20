"""A non-editable wheel installs, ships the profiles, and `advisor inspect` works from another dir."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def _without_pythonpath() -> dict[str, str]:
    """This environment less PYTHONPATH, which may point at this checkout (the wheel must provide `advisor`)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    args = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    try:
        import setuptools  # noqa: F401

        args.insert(4, "--no-build-isolation")  # offline-friendly when setuptools is present
    except ImportError:
        pass
    result = _run(args)
    assert result.returncode == 0, result.stderr
    (whl,) = out.glob("*.whl")
    return whl


def test_wheel_contains_profiles(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "profiles/gpus.json" in names and "profiles/models/Qwen/Qwen2.5-7B.json" in names
    assert any(n.startswith("wrappers/") for n in names)


def test_installed_wheel_runs_from_elsewhere(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # Dependencies come from this interpreter's site-packages (a plain path: its .pth files, such as
    # an editable install of this repo, are not processed, so only the wheel provides `advisor`).
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "parent_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: an editable install of this repo in that site-packages (CI's `pip install -e`)
    # is visible to pip as its metadata, and pip would skip the wheel as "already satisfied" (no
    # `advisor` script); it also keeps pip from uninstalling anything outside the new venv.
    result = _run([str(py), "-m", "pip", "install", "-q", "--ignore-installed", "--no-deps", "--no-index", str(wheel)])
    assert result.returncode == 0, result.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean = _without_pythonpath()
    result = _run([str(env_dir / "bin" / "advisor"), "inspect", "Qwen/Qwen2.5-7B", "--json"], cwd=elsewhere, env=clean)
    assert result.returncode == 0, result.stderr
    assert '"total_params": 7615616512' in result.stdout
    where = _run([str(py), "-c", "import advisor, profiles; print(advisor.__file__, profiles.__file__)"], cwd=elsewhere,
                 env=clean)
    assert str(env_dir) in where.stdout and str(ROOT) not in where.stdout
