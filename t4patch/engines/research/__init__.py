"""Research harnesses used by the GPU tests and recorded runs; not part of the CLI and not shipped in the wheel."""
