"""t4patch's shipped data (``patches/``, ``builders/``, ``verify/``): where it lives and how it is read."""
