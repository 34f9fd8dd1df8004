"""Which requests the explorer answers. A web page the learner happens to visit can send requests to a server on
this machine: by a domain name it rebinds to 127.0.0.1 (its requests then carry that name in their Host header),
or straight to 127.0.0.1 from its own origin. So the explorer answers only requests addressed to one of its own
names and port, takes requests that change something (POST: generate, read, analyse) only from its own page, lets
no other site's page reach its API, and asks browsers never to show it inside another site's frame.

An ASGI middleware around the app, so that every response, the refusals and a failure's 500 included, carries
the same headers."""

import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# nosniff: a file is only ever what its Content-Type says; the frame rules: no other page may frame this one
HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
           "Content-Security-Policy": "frame-ancestors 'none'"}
FAILED = "the explorer failed to answer this request (a bug: its console says where); the other requests still work"


def normal_name(name):
    """A host name as compared: lower case, an IP address in its one canonical spelling (no brackets)."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name
    mapped = getattr(address, "ipv4_mapped", None)  # a dual-stack socket names IPv4 peers ::ffff:a.b.c.d
    return str(mapped or address)


def is_address(name):
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_wildcard(address):
    try:
        return ipaddress.ip_address(normal_name(address)).is_unspecified
    except ValueError:
        return address == ""


def own_names(host, bound):
    """The names the explorer answers to when asked to listen on host and bound to the address bound: the loopback
    names, both of those, and, for a wildcard bind (every network), this machine's host name and its addresses.
    (Any address a connection arrived on is accepted as well: see Guard.)"""
    names = {normal_name(n) for n in (*LOOPBACK_NAMES, host, bound) if n}
    if is_wildcard(bound):
        for name in {socket.gethostname(), socket.getfqdn()}:
            names.add(normal_name(name))
            try:
                names.update(normal_name(info[4][0]) for info in socket.getaddrinfo(name, None))
            except OSError:  # a host name that does not resolve is still a name a browser may be given
                pass
    return names


def split_host(value):
    """(name, port) of a Host header's value ('[::1]:8000', 'localhost:8000', 'localhost' = port 80), or None."""
    try:
        parts = urlsplit("http://" + value)
        if parts.hostname is None or parts.path or parts.query or parts.fragment or parts.username:
            return None
        return normal_name(parts.hostname), parts.port or 80
    except ValueError:  # a port that is not a number, or out of range
        return None


class Guard:
    """Refuses, with a 4xx and {"error": "one line"}: a Host the explorer is not (name and port); a state-changing
    request from another origin; an API request that a browser says comes from another site. Adds HEADERS to
    every response. A request the app fails on is a 500 and one line, without the exception's words (which may
    name this machine's paths), from here: the server's own 500 would come from outside, without HEADERS."""

    def __init__(self, app, names, port):
        self.app, self.names, self.port = app, frozenset(names), port

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self.refusal(scope, Headers(scope=scope))
        if problem:
            await JSONResponse({"error": problem[1]}, status_code=problem[0], headers=HEADERS)(scope, receive, send)
            return
        started = False

        async def send_with_headers(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for key, value in HEADERS.items():
                    headers.append(key, value)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if started:  # the answer's headers are out (a stream): the server can only cut it short
                raise
            logging.getLogger("uvicorn.error").exception("explorer: %s %s failed", scope["method"], scope["path"])
            await JSONResponse({"error": FAILED}, status_code=500, headers=HEADERS)(scope, receive, send)

    def refusal(self, scope, headers):
        """(status, line) for a request the explorer does not answer, else None."""
        hosts = headers.getlist("host")
        where = split_host(hosts[0]) if len(hosts) == 1 else None
        if where is None or not self.is_own(where, scope.get("server")):
            return 400, (f"this explorer answers only at its own address, port {self.port} (e.g. "
                         f"http://127.0.0.1:{self.port}/ on this machine); through an SSH tunnel, forward the same "
                         "port number")
        if scope["method"] not in SAFE_METHODS:
            origin = headers.get("origin")
            if origin is not None and origin_of(origin) != ("http", *where):
                return 403, "refused: this request came from another site's page, not the explorer's own"
        fetch_site = headers.get("sec-fetch-site")
        if scope["path"].startswith("/api/") and fetch_site not in (None, "same-origin", "none"):
            return 403, "refused: the explorer's API answers only its own page, not another site's"
        return None

    def is_own(self, where, server):
        """An own name at the port listened on; or the very address the connection arrived on (an address, not a
        name: no other site can make a browser send it for its own origin)."""
        name, port = where
        if port != self.port:
            return False
        return name in self.names or (server is not None and is_address(name) and
                                      name == normal_name(str(server[0])))


def origin_of(value):
    """(scheme, name, port) of an Origin header, e.g. ('http', '127.0.0.1', 8000); None for 'null' or nonsense."""
    try:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or parts.hostname is None:
            return None
        return parts.scheme, normal_name(parts.hostname), parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
