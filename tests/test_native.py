"""Where a native kernel library is cached: by what decides the binary, not by where things are installed."""

from pathlib import Path

from collage_core.native import NativeLibrary


def _library(tmp_path, source_text, include_dir, compiler="/usr/bin/g++", versions=("1.0",)):
    source = tmp_path / "src" / "kernel.cc"
    source.parent.mkdir(exist_ok=True)
    source.write_text(source_text)
    return NativeLibrary("demo", source, compiler, (f"-I{include_dir}",), versions=versions)


def test_the_cache_key_ignores_install_directories_but_not_sources_flags_or_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    here = _library(tmp_path, "int f();", "/usr/local/lib/python3.11/site-packages/lib/include").path()
    assert here.is_relative_to(tmp_path / "cache" / "demo")
    assert _library(tmp_path, "int f();", "/tmp/site/lib/include", compiler="/opt/gcc/bin/g++").path() == here
    assert _library(tmp_path, "int g();", "/tmp/site/lib/include").path() != here
    assert _library(tmp_path, "int f();", "/tmp/site/lib/other").path() != here
    assert _library(tmp_path, "int f();", "/tmp/site/lib/include", versions=("1.1",)).path() != here
    assert Path(_library(tmp_path, "int f();", "include").command(Path("out"))[0]) == Path("/usr/bin/g++")
