"""`/metrics` as a key that is not an operator's reads it: the samples of its models and its own key, and the
service's aggregates; label values read as the text format escapes them."""

from proxy.api.visibility import shown_series
from scheduling.keys.scope import UNRESTRICTED, KeyScope

SCRAPE = b"""# HELP llamaswap_requests_total Model requests.
# TYPE llamaswap_requests_total counter
llamaswap_requests_total{model="chat",route="/v1/chat/completions",status="200"} 3.0
llamaswap_requests_total{model="llama",route="/v1/chat/completions",status="200"} 1.0
llamaswap_key_requests_total{key="say \\"hi\\"",status="200"} 3.0
llamaswap_key_requests_total{key="neighbour",status="200"} 1.0
llamaswap_scheduler_queue_depth{band="normal"} 0.0
"""


def test_a_scoped_key_reads_its_models_its_own_key_and_the_aggregates():
    shown = shown_series(KeyScope(name='say "hi"', models=("ch*",)), SCRAPE).decode()
    assert 'model="chat"' in shown and 'key="say \\"hi\\""' in shown and 'band="normal"' in shown
    assert 'model="llama"' not in shown and "neighbour" not in shown
    assert "# TYPE llamaswap_requests_total counter" in shown


def test_an_operator_key_reads_every_series():
    assert shown_series(UNRESTRICTED, SCRAPE) == SCRAPE
    assert shown_series(KeyScope(name="ops", models=("chat",), operator=True), SCRAPE) == SCRAPE
