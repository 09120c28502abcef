"""Make ``tests/`` importable so test modules can ``import oracle`` (the independent reference)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
