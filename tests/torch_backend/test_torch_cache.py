"""Where the torch backend keeps its tuning database; neither torch nor TVM needed."""

import subprocess
import sys
from pathlib import Path

from fastdlight.torch_backend import CACHE_ENV, cache_dir, database_dir


def test_fastdlight_cache_moves_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "elsewhere"
    assert database_dir() == tmp_path / "elsewhere" / "tuning"


def test_fastdlight_cache_expands_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(CACHE_ENV, "~/fdl")
    assert cache_dir() == tmp_path / "fdl"


def test_xdg_cache_home_is_used(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "fastdlight"


def test_default_is_under_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "fastdlight"


def test_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    # the XDG spec: a relative path is invalid and must be ignored
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "fastdlight"


def test_empty_fastdlight_cache_is_unset(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "fastdlight"


def test_nothing_is_created_by_asking(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    database_dir()
    assert not (tmp_path / "c").exists()


def test_importing_the_package_imports_neither_torch_nor_tvm():
    code = ("import sys, fastdlight.torch_backend as tb; tb.cache_dir(); "
            "print(sorted(m for m in ('torch', 'tvm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent)
    assert out.stdout.strip() == "[]"
