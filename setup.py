"""Builds the local index's optional C parts and names the packages (the export side installs
under another name than its folder's); everything else is in pyproject.toml.

The scoring kernel (loaded with ctypes), the hit builder and the graph walker (CPython
extensions) are optional: without a C compiler the install still succeeds and the local index scores with
numpy/scipy and builds hits in Python (same results, slower). The build log says so in one line
(pip shows it with `pip install -v`; `index stats` and `serve` say it at their first start).
"""

import sys

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext

# -ffp-contract=off: a fused multiply-add would round once where the numpy path rounds twice.
FLAGS = ["/O2", "/fp:precise"] if sys.platform == "win32" else ["-O3", "-ffp-contract=off", "-fvisibility=hidden"]


class OptionalBuildExt(build_ext):
    """build_ext that ends with one clear line when optional extensions could not be built
    (setuptools only warns per extension, between compiler output)."""

    def run(self):
        self.not_built = []
        super().run()
        if self.not_built:
            names = ", ".join(name.rpartition(".")[2] + ".c" for name in self.not_built)
            print(f"d2s-search: built WITHOUT the local index's compiled parts ({names}: no working C compiler or "
                  "Python headers; the warnings above say why). Everything works, searches are slower (numpy). "
                  "Install a C compiler and Python's headers, then reinstall to build them.", file=sys.stderr, flush=True)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception:  # setuptools turns it into a warning for an optional extension
            if getattr(ext, "optional", False):
                self.not_built.append(ext.name)
            raise


# The export side's folder is onnx_export/; it installs as d2s_onnx_export, a name of this
# project (a bare `onnx_export` could clash with another distribution's package).
EXPORT_FOLDER, EXPORT_PACKAGE = "onnx_export", "d2s_onnx_export"
PACKAGES = find_namespace_packages(include=["d2s_search", "d2s_search.*"]) + [
    EXPORT_PACKAGE + name[len(EXPORT_FOLDER):]
    for name in find_namespace_packages(include=[EXPORT_FOLDER, EXPORT_FOLDER + ".*"])
]

setup(
    packages=PACKAGES,
    package_dir={EXPORT_PACKAGE: EXPORT_FOLDER},
    cmdclass={"build_ext": OptionalBuildExt},
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
            depends=["d2s_search/backends/local/_score.c", "d2s_search/_untrack.h", "d2s_search/_collapse.h"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        # A CPython extension: a dense query's candidates from an HNSW graph, without faiss.
        Extension(
            "d2s_search.backends.local._graph",
            ["d2s_search/backends/local/_graph.c"],
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
        # A CPython extension: a search's words with inflections collapsed, every hit in one call.
        Extension(
            "d2s_search._words",
            ["d2s_search/_words.c"],
            depends=["d2s_search/_untrack.h", "d2s_search/_collapse.h"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
    ],
)
