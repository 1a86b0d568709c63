"""Every test's backend cache (tuning database, kept programs) is a fresh directory, never the
user's."""

import pytest


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDLIGHT_CACHE", str(tmp_path / "fastdlight_cache"))
    return tmp_path / "fastdlight_cache"
