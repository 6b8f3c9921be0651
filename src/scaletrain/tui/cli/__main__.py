"""`python -m scaletrain.tui.cli ...` is `scaletrain ...`."""

import sys

from scaletrain.tui.cli.main import main

sys.exit(main())
