"""Refusing to mix bundles in one index: the checks of a stored ``_meta`` identity, the same on
both engines (only the CLI option that names the index differs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from d2s_search.backends.base import IndexIdentity
from d2s_search.errors import BundleMismatchError, IndexStoreError

# ``_meta`` of a user's index given picture search (``ingest --update-existing``): the field
# whose value a hit shows as its path.
IMAGE_FIELD_META = "image_field"


def check_identity(index_name: str, url: str, wanted: IndexIdentity, stored: IndexIdentity | None,
                   index_option: str) -> None:
    """Raise unless ``stored`` was written by the bundle ``wanted`` (or records no fingerprint)."""
    if stored is None:
        raise IndexStoreError(f"index {index_name!r} vanished at {url}")
    if stored.fingerprint and stored.fingerprint != wanted.fingerprint:
        raise BundleMismatchError(
            f"index {index_name!r} was filled with bundle {stored.fingerprint[:12]}"
            f"{' (' + stored.model + ')' if stored.model else ''}, not {wanted.fingerprint[:12]}: "
            f"use that bundle, another {index_option}, or `d2s-search index reindex`"
        )
    check_dims(index_name, wanted, stored)


def check_dims(index_name: str, wanted: IndexIdentity, stored: IndexIdentity) -> None:
    if stored.dense_dim and wanted.dense_dim and stored.dense_dim != wanted.dense_dim:
        raise BundleMismatchError(
            f"index {index_name!r} holds {stored.dense_dim}-d dense vectors, the bundle makes "
            f"{wanted.dense_dim}-d ones"
        )


def meta_identity(meta: Mapping[str, Any] | None) -> IndexIdentity | None:
    """``_meta`` of a mapping -> the identity it records (None if not a d2s index)."""
    if not meta or "fingerprint" not in meta:
        return None
    return IndexIdentity(
        fingerprint=str(meta.get("fingerprint", "")),
        dense_dim=int(meta.get("dense_dim", 0) or 0),
        model=str(meta.get("model", "")),
        bundle_path=str(meta.get("bundle_path", "")),
    )
