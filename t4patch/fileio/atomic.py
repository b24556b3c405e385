"""Write a JSON document so that a reader never sees half of it.

The state record (status, revert), the build record (verify build) and the benchmark's state (a resumed run)
are all read back by later runs: a crash mid-write must leave the previous document or the new one, never a
truncated file. Written next to the target as ``NAME.tmp`` and renamed over it (same directory, same
filesystem, so the rename is atomic).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, doc: Any) -> None:
    """Replace ``path`` with ``doc`` as indented JSON plus a final newline."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
