"""``python -m halfmoon``: the same command line as the ``halfmoon`` script."""

from halfmoon.cli.main import main

raise SystemExit(main())
