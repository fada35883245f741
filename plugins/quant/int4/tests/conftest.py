"""Makes the tests' support modules (int_weights.py, tiny_checkpoints.py) importable under
--import-mode=importlib."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
