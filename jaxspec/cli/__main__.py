"""``python -m jaxspec.cli ...``: the ``jaxspec`` command."""

import sys

from jaxspec.cli import main

sys.exit(main())
