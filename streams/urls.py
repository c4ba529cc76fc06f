"""Showing a URL without its secret: the one place a server's URL is masked for a message, a log
line or a ``repr``. Only the password is hidden; the user, host, port and path stay, because they
are what an operator needs to see which server and account were tried."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "****"
# For a URL too malformed to parse (an unclosed [IPv6 bracket): whatever sits between the user
# and the last @ of the authority.
_USERINFO = re.compile(r"(://[^:@/]*):[^@]*@")


def masked(url: str) -> str:
    """``url`` with its password, if any, as ``****``: ``redis://u:pw@h:1/0`` ->
    ``redis://u:****@h:1/0``. A URL without a password is returned as it is."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _USERINFO.sub(rf"\1:{MASK}@", url, count=1)
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{hostinfo}"))
