"""The optional C extension; everything else is in pyproject.toml.

`bridge.native._speedups` is the C fast path of the value loop (see docs/decisions.md). `optional=True`:
a machine without a C compiler still installs, and the pure-Python path (the reference) runs;
tests/test_speedups.py::test_extension_is_built fails in CI unless the extension is built.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("bridge.native._speedups", sources=["bridge/native/_speedups.c"], optional=True,
                             extra_compile_args=["-O2"])])
