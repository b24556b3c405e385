"""The environment t4patch reads or changes (``--python`` / ``--site-packages``), and how code runs there."""
