"""The patching core: manifest, exact diff apply, pure plan, locked execute, state record, status model."""
