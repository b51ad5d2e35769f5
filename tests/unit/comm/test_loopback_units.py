"""comm/loopback.py's loopback_address: which host names mean this machine's loopback alone, read from what the
resolver answers (written here, so no name is looked up on any network)."""
import socket

import pytest

from parasim.comm.loopback import loopback_address


def _answers(*addresses: str):
    def fake(host, port, type=0):  # noqa: A002 (socket.getaddrinfo's own keyword)
        assert (host, port, type) == ("somehost", None, socket.SOCK_STREAM), (host, port, type)
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, type, 6, "", (a, 0)) for a in addresses]
    return fake


@pytest.mark.parametrize("answers, want", [
    (("127.0.0.1",), "127.0.0.1"),
    (("::1", "127.0.0.1"), "127.0.0.1"),     # localhost on both: the IPv4 one is listened on
    (("::1",), "::1"),                        # IPv6 alone: the first
    (("::1", "::ffff:127.0.0.2"), "::1"),     # no IPv4 form: the first answer, not the second
    (("127.0.0.1", "10.0.0.7"), None),        # one address another machine reaches: not loopback alone
    ((), None),                               # nothing resolved
])
def test_a_host_is_loopback_only_when_every_address_it_resolves_to_is(monkeypatch, answers, want):
    monkeypatch.setattr(socket, "getaddrinfo", _answers(*answers))
    assert loopback_address("somehost") == want


def test_a_host_that_does_not_resolve_is_none(monkeypatch):
    def refuse(host, port, type=0):  # noqa: A002
        raise socket.gaierror("no such host")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    assert loopback_address("nowhere") is None
    monkeypatch.undo()
    assert loopback_address("127.0.0.1") == "127.0.0.1"  # a numeric address resolves without a lookup
