"""Builds the local index's optional C parts; everything else is in pyproject.toml.

The scoring kernel (loaded with ctypes) and the hit builder (a CPython extension) are
optional: without a C compiler the install still succeeds and the local index scores with
numpy/scipy and builds hits in Python (same results, slower).
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
        ),
        # A CPython extension: a sparse query's top k, with _score.c compiled in.
        Extension(
            "d2s_search.backends.local._query",
            ["d2s_search/backends/local/_query.c"],
            depends=["d2s_search/backends/local/_score.c"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        # A CPython extension (imported, not loaded with ctypes): builds search hits.
        Extension(
            "d2s_search.backends.local._hits",
            ["d2s_search/backends/local/_hits.c"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
    ]
)
