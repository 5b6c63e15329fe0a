"""d2s-search: text-to-image search on learned sparse (Dense2Sparse) vectors."""

__version__ = "0.1.0"
