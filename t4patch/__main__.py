"""`python -m t4patch` is the same program as the `t4patch` console script."""

from t4patch.cli import main

raise SystemExit(main())
