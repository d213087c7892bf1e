"""Where notifications named by policies may go: public addresses, and what the admin allows.

Editors name notification targets in policies, and the server then POSTs to them, signed with its
secret. Left open, that lets an editor make the server reach what only the server can reach: itself
(its own API on loopback), the cloud's metadata endpoint (169.254.169.254), the cluster's services.
So, as Grafana does for its outgoing requests, a policy's target may reach only **global** addresses,
unless ``STEPWATCH_NOTIFY_ALLOW`` (hosts, addresses or networks) says otherwise. The admin's own
targets (``STEPWATCH_NOTIFY`` and those of ``STEPWATCH_POLICY``) are trusted as they are.

A target is checked when a policy is saved (a clear 422) and again at each delivery: the name is
resolved then, every address it gives must be allowed, and a webhook is sent to the very address
checked (with the name as ``Host`` and TLS server name), so a name re-pointed after the check (DNS
rebinding) reaches nothing new. Apprise targets with a host of their own (``json://``, ``xml://``,
``form://``, self-hosted chat servers, ``mailto://``) are checked the same way just before the
delivery; Apprise connects by itself then. Other Apprise URLs (``slack://``, ``discord://``...) go to
their service's fixed hosts.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["TargetRefused", "TargetRules", "contacted_host", "parse_allow_list"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOSTED_SCHEMES = frozenset(
    f"{name}{tls}"
    for name in ("json", "xml", "form", "mmost", "rocket", "gotify", "ntfy", "matrix", "mailto", "apprise")
    for tls in ("", "s")
)
"""Apprise schemes whose URL names the server to contact (the rest go to their service's own hosts)."""


class TargetRefused(ValueError):
    """A notification target that points where policies may not send."""


def parse_allow_list(text: str) -> tuple[str, ...]:
    """``STEPWATCH_NOTIFY_ALLOW``: host names, addresses or networks (CIDR), separated by commas or spaces."""
    found: list[str] = []
    for part in text.replace(",", " ").split():
        entry = part.strip().lower().rstrip(".")
        try:
            found.append(str(ipaddress.ip_network(entry.strip("[]"), strict=False)))
            continue
        except ValueError:
            pass
        if not entry or any(not (c.isalnum() or c in "-.") for c in entry):
            raise ValueError(f"not a host name, address or network: {part!r}")
        found.append(entry)
    return tuple(found)


def contacted_host(url: str) -> tuple[str, int] | None:
    """The host (and port) a target's delivery connects to, or ``None`` when it goes to a service's fixed hosts."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") and scheme not in _HOSTED_SCHEMES:
        return None
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return None
    try:
        port = parts.port
    except ValueError:
        port = None
    return host, port or (443 if scheme.endswith("s") else 80)


@dataclass(frozen=True)
class TargetRules:
    """What policies' targets may reach (see the module docstring)."""

    allow: tuple[str, ...] = ()
    """Names, addresses and networks allowed although not global (:func:`parse_allow_list`)."""
    trusted: frozenset[str] = frozenset()
    """The admin's own target URLs: never checked."""
    _names: frozenset[str] = field(init=False, repr=False)
    _networks: tuple[Network, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        names: set[str] = set()
        networks: list[Network] = []
        for entry in self.allow:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(entry)
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_networks", tuple(networks))

    def address_allowed(self, address: Address) -> bool:
        """Whether a target may connect to ``address``: a global one, or one the allow-list holds."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address in network for network in self._networks):
            return True
        return address.is_global and not address.is_multicast

    def _needs_check(self, url: str) -> tuple[str, int] | None:
        if url in self.trusted:
            return None
        found = contacted_host(url)
        if found is None or found[0].lower() in self._names:
            return None
        return found

    def _verdict(self, host: str, addresses: Iterable[str]) -> str | None:
        """The first address of ``host`` to connect to, after checking every one (``TargetRefused``)."""
        checked: list[str] = []
        for text in addresses:
            address = ipaddress.ip_address(text.partition("%")[0])
            if not self.address_allowed(address):
                kind = "loopback" if address.is_loopback else "link-local" if address.is_link_local else "private"
                where = host if host == str(address) else f"{host} ({address})"
                raise TargetRefused(
                    f"notification target {where} is a {kind} or otherwise non-public address: policies may "
                    "notify only public hosts unless the server's admin allows this one (STEPWATCH_NOTIFY_ALLOW)"
                )
            checked.append(str(address))
        return checked[0] if checked else None

    def check(self, url: str) -> None:
        """At a policy's save: ``TargetRefused`` when the target's host is (or resolves to) an address
        policies may not reach. A name that does not resolve now passes (it is checked at each delivery)."""
        found = self._needs_check(url)
        if found is None:
            return
        host, port = found
        if host.lower() in ("localhost",) or host.lower().endswith(".localhost"):
            self._verdict(host, ["127.0.0.1"])
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return
        self._verdict(host, [str(info[4][0]) for info in infos])

    async def resolve(self, url: str) -> str | None:
        """At a delivery: the checked address to connect to, ``None`` when the target needs no check;
        ``TargetRefused`` when it may not be reached (or its name does not resolve)."""
        found = self._needs_check(url)
        if found is None:
            return None
        host, port = found
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise TargetRefused(f"notification target {host} does not resolve ({exc})") from None
        return self._verdict(host, [str(info[4][0]) for info in infos])
