"""What the command modules share: durations on the command line."""

from __future__ import annotations

import pytest

from router.cli.common import parse_duration
from streams.errors import ConfigurationError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("12h", 43_200), ("1d", 86_400), (" 7d ", 604_800)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text, option="--since") == seconds


@pytest.mark.parametrize("text", ["", "0m", "7", "d", "m30", "1w", "1.5h", "-2h"])
def test_a_bad_duration_names_the_option_and_the_grammar(text: str) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"--published-before must be a positive duration.*e\.g\. 90s, 30m, 12h, 7d; got",
    ):
        parse_duration(text, option="--published-before")
