"""`pip install ./clients/python` works: the package builds into a wheel holding the generated
models and the typing marker, with the dependencies and extras pyproject.toml declares."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("project")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(PROJECT / name, src / name)
    shutil.copytree(PROJECT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        check=True,
    )
    (whl,) = out.glob("*.whl")
    return whl


def test_wheel_contents(wheel):
    assert wheel.name.startswith("recollect_memory_client-0.1.0-py3-none-any")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (
        "recollect_client/__init__.py",
        "recollect_client/client.py",
        "recollect_client/async_client.py",
        "recollect_client/errors.py",
        "recollect_client/pagination.py",
        "recollect_client/py.typed",
        "recollect_client/_generated/models.py",
        "recollect_client/integrations/langchain.py",
        "recollect_client/integrations/llama_index.py",
    ):
        assert f in names, f
    assert not any("tests/" in n or "__pycache__" in n for n in names)


def test_wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        (meta_name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(z.read(meta_name))
    assert meta["Name"] == "recollect-memory-client"
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist")
    core = sorted(r for r in requires if "extra ==" not in r)
    assert core == ["httpx<1,>=0.27", "pydantic<3,>=2.7"]
    assert set(meta.get_all("Provides-Extra")) == {"langchain", "llamaindex"}
    assert any(r.startswith("langchain-core") and 'extra == "langchain"' in r for r in requires)
    assert any(r.startswith("llama-index-core") and 'extra == "llamaindex"' in r for r in requires)
