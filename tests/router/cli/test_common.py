"""What the command modules share: durations and feed URLs on the command line."""

from __future__ import annotations

import pytest

from router.cli.common import feed_url, parse_duration
from router.cli.main import main
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


@pytest.mark.parametrize(
    "feed", ["", "\n", " ", "127.0.0.1:8770", "ftp://host/feed", "http://", "http://host/a b"]
)
@pytest.mark.parametrize("command", [["pump"], ["pump", "checkpoint"], ["pump", "forget"]])
def test_a_feed_that_is_no_url_is_refused_in_one_line_naming_the_option(
    command: list[str], feed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--reason", "r"] if command[-1] == "forget" else []
    with pytest.raises(SystemExit) as ended:
        main([*command, "--feed", feed, *extra])
    assert ended.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --feed: must be the feed's URL" in last and repr(feed) in last


def test_a_feed_url_passes_as_given() -> None:
    assert feed_url("http://127.0.0.1:8770/feed?x=1") == "http://127.0.0.1:8770/feed?x=1"
    assert feed_url("https://feeds.example/changes") == "https://feeds.example/changes"
