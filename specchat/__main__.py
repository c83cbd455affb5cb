"""``python -m specchat``: the same as the ``specchat`` command (for machines where specchat runs
from a source tree on ``PYTHONPATH`` without being installed, such as the lent GPU machine)."""

from specchat.cli import main

raise SystemExit(main())
