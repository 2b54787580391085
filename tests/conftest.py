"""Shared pytest fixtures: each area's fixtures live in tests/fixtures_<area>.py and are pulled in here."""

from tests.fixtures_fake import *  # noqa: F403
from tests.fixtures_http import *  # noqa: F403
from tests.fixtures_pipeline import *  # noqa: F403
from tests.fixtures_prometheus import *  # noqa: F403
from tests.fixtures_s3 import *  # noqa: F403
from tests.fixtures_tsa import *  # noqa: F403
