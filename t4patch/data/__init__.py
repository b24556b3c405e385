"""t4patch's shipped data (``patches/``, ``recipes/``, ``hardware/``, ``engine-data/``, ``cases/``): where it lives
and how it is read."""
