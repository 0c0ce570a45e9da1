"""Where the tests find the repository: its root (``REPO``), the tests' folder and this support folder, wherever a
test file lies in tests/ (tests/<package>/test_<module>.py; docs/testing.md, "Layout")."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
