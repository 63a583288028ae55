"""`python -m fakemodel`: the stand-in model server (see `fakemodel.server`)."""

import sys

from fakemodel.server import main

sys.exit(main())
