"""``python -m cpkv.cli``: the ``cpkv`` command."""

import sys

from . import main

sys.exit(main())
