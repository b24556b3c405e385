"""``tomllib`` on Python >= 3.11, the ``tomli`` backport on 3.10 (same API)."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

__all__ = ["tomllib"]
