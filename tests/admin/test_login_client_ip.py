"""The address the admin's login throttling counts a try against: the TCP peer, or behind trusted reverse
proxies the nearest address they did not add."""

from llamaswap_site.client_ip import client_address, trusted_proxies

PROXIES = trusted_proxies(" 10.0.0.5, 10.0.0.6 ,")


def test_without_trusted_proxies_the_peer_is_the_client_whatever_the_headers_say():
    assert client_address({"REMOTE_ADDR": "203.0.113.9", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}, frozenset()) == "203.0.113.9"
    assert client_address({"REMOTE_ADDR": "203.0.113.9", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}, PROXIES) == "203.0.113.9"


def test_behind_trusted_proxies_the_right_most_address_they_did_not_add_is_the_client():
    assert PROXIES == {"10.0.0.5", "10.0.0.6"}
    # The client wrote 1.2.3.4 itself; 198.51.100.7 connected to the first proxy, which connected to the second.
    meta = {"REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_FOR": "1.2.3.4, 198.51.100.7, 10.0.0.6"}
    assert client_address(meta, PROXIES) == "198.51.100.7"


def test_a_trusted_proxy_that_names_no_one_else_is_the_client():
    assert client_address({"REMOTE_ADDR": "10.0.0.5"}, PROXIES) == "10.0.0.5"
    assert client_address({"REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_FOR": " 10.0.0.6 ,"}, PROXIES) == "10.0.0.5"
