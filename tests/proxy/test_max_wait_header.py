"""`X-LlamaSwap-Max-Wait` as read from a request: decimal seconds, and a refusal that says what it takes."""

from __future__ import annotations

import pytest

from proxy.serving.errors import ProxyError
from proxy.serving.inbound import max_wait_seconds


@pytest.mark.parametrize("value, seconds", [("30", 30.0), (" 2.5", 2.5), (".5", 0.5), ("7.", 7.0)])
def test_decimal_seconds_are_taken(value, seconds):
    assert max_wait_seconds({"x-llamaswap-max-wait": value}) == seconds


@pytest.mark.parametrize("value", ["1e3", "9" * 400, "0", "-1", "nan", "soon", "١٢"])
def test_a_refusal_says_what_is_taken_and_repeats_little_of_the_value(value):
    with pytest.raises(ProxyError) as refused:
        max_wait_seconds({"x-llamaswap-max-wait": value})
    message = refused.value.message
    assert refused.value.status == 400 and "a decimal number of seconds, e.g. 30 or 2.5" in message
    assert "positive number" not in message, "1e3 is a positive number: the message must say what is accepted"
    assert value[:40] in message and len(message) < 200, message
