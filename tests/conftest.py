"""Shared pytest fixtures: each area's fixtures live in tests/fixtures_<area>.py and are pulled in here."""

# One star-import line per fixture module (keeps areas apart).
from tests.fixtures_http import *  # noqa: F401,F403
from tests.fixtures_prometheus import *  # noqa: F401,F403
from tests.fixtures_s3 import *  # noqa: F401,F403
from tests.fixtures_fake import *  # noqa: F401,F403
