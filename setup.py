"""Builds the local index's optional C scoring kernel; everything else is in pyproject.toml.

The kernel is loaded with ctypes and is optional: without a C compiler the install still
succeeds and the local index scores with numpy/scipy (same results, slower).
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: a fused multiply-add would round once where the numpy path rounds twice.
FLAGS = ["/O2", "/fp:precise"] if sys.platform == "win32" else ["-O3", "-ffp-contract=off", "-fvisibility=hidden"]

setup(
    ext_modules=[
        Extension(
            "d2s_search.backends.local._score",
            ["d2s_search/backends/local/_score.c"],
            extra_compile_args=FLAGS,
            optional=True,
        )
    ]
)
