"""d2s-search: text-to-image search on learned sparse (Dense2Sparse) vectors.
Runtime core (bundle, encoder, images, ingest, search) plus cli/, backends/, serve/ and the torch-side train/.
"""

__version__ = "0.1.0"
