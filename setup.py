"""The optional C extension; everything else is in pyproject.toml.

`bridge.native._speedups` is the C fast path of the value loop (see docs/decisions.md, "The C fast
path" and "The Python <-> C contract"): the units of bridge/native/src/ and their one header.
`optional=True`: a machine without a C compiler still installs, and the pure-Python path (the
reference) runs; tests/test_speedups.py::test_extension_is_built fails in CI unless the extension is built.
"""
from glob import glob

from setuptools import Extension, setup

SOURCES = sorted(glob("bridge/native/src/*.c"))

setup(ext_modules=[Extension("bridge.native._speedups", sources=SOURCES, depends=["bridge/native/src/speedups.h"],
                             optional=True, extra_compile_args=["-O2"])])
