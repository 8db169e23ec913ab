"""Where a native kernel library is cached: by what decides the binary, not by where things are installed."""

import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

from collage_core.build.native import KERNEL_CACHE_HEADER, NativeLibrary


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


def test_shared_headers_are_on_the_include_path_and_in_the_cache_key(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    header = tmp_path / "shared" / "collage_kernel_cache.h"
    header.parent.mkdir()
    header.write_text("// one cache")
    plain = _library(tmp_path, "int f();", "include")
    with_header = attrs.evolve(plain, headers=(header,))
    assert f"-I{header.parent}" in with_header.command(Path("out"))
    before = with_header.path()
    assert before != plain.path()
    header.write_text("// another cache")
    assert with_header.path() != before


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_kernel_cache_header_compiles_and_keeps_one_kernel_per_key(tmp_path):
    test = tmp_path / "cache_test.cc"
    test.write_text(r'''
#include <cassert>
#include "collage_kernel_cache.h"
struct Kernel { explicit Kernel(int v) : value(v) {} int value; };
int main() {
  collage::KernelCache<Kernel> cache(2);
  int made = 0;
  auto make = [&](int v) { return [&made, v] { ++made; return std::make_unique<Kernel>(v); }; };
  Kernel* a = cache.Get("a", make(1));
  assert(cache.Get("a", make(9)) == a && a->value == 1 && made == 1);
  cache.Get("b", make(2));
  assert(cache.Size() == 2);
  assert(cache.Get("c", make(3))->value == 3 && cache.Size() == 1);  // full: emptied first
  assert(&collage::ProcessKernels<Kernel>() == &collage::ProcessKernels<Kernel>());
  assert(collage::DeviceKey("k", 0) != collage::DeviceKey("k", 1));
  return 0;
}
''')
    binary = tmp_path / "cache_test"
    subprocess.run(["g++", "-std=c++17", f"-I{KERNEL_CACHE_HEADER.parent}", str(test), "-o", str(binary)], check=True)
    subprocess.run([str(binary)], check=True)
