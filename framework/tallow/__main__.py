"""``python -m tallow`` runs the ``tallow`` command."""

from tallow.cli import main

raise SystemExit(main())
