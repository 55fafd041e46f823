"""Server URLs as perfsweep accepts them: the one place a URL from a user enters.

Only ``http://`` is accepted: TLS is not implemented end to end, so an ``https://`` URL is
refused rather than sent as plain HTTP. The scenario checks ``model.url`` with it when it is
loaded, and the targets and the load commands normalise every URL they are given.
"""

from __future__ import annotations

from analyzer.errors import InputError


def http_url(url: str) -> str:
    """``url`` as ``http://host:port`` (a bare ``host:port`` gets ``http://``; no trailing /).

    Raises:
        InputError: ``https://`` (TLS is not supported: refused, never sent as plain HTTP) or
            another scheme.
    """
    text = url.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return f"http://{text}"
    if scheme.lower() == "https":
        raise InputError(
            f"{url!r}: https:// is not supported (perfsweep speaks plain HTTP only); "
            "use the server's http:// address, or put a local TLS-terminating proxy in front"
        )
    if scheme.lower() != "http":
        raise InputError(f"{url!r}: the URL must start with http://")
    return f"http://{rest}"
