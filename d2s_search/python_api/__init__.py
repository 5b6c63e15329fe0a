"""The public Python API, exported lazily from ``d2s_search`` itself (``d2s_search.Index``,
``d2s_search.Encoder``, ...): encoding (``Encoder``), searching and ingesting (``Index``), and
the search page as an app to mount (``search_app``). Runtime only: ONNX Runtime loads with the
first encoder, never torch; nothing here imports the command line.
"""
