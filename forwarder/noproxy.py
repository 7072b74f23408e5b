"""HTTP sessions for IMDS: never through a proxy, whatever the environment says (IMDS answers only from
the VM itself, and a proxy would see its tokens). Used by the IMDS client and the token client alike."""

from __future__ import annotations

import requests


def no_proxy_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # ignore HTTP(S)_PROXY, NO_PROXY and .netrc: IMDS is never proxied
    session.proxies = {}
    # Redirects are refused by allow_redirects=False on each request. (max_redirects = 0 here made
    # requests raise TooManyRedirects, not an ImdsError, on any 3xx even with allow_redirects=False.)
    session.headers.pop("Proxy-Authorization", None)
    return session
