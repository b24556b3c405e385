"""File primitives every writer shares: sha256 in manifest hex, and atomic (fsynced) replacement."""
