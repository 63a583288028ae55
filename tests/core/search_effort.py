"""How many examples the core's property tests try: all of them under CI=true (which `.ci/run`
exports) or LLAMASWAP_FULL_SEARCH=1, a third elsewhere. A local `make test` then spends about a
third of the time on them, while CI and the mutation script search as hard as ever."""

import os

from hypothesis import settings

FULL = os.environ.get("CI", "").strip().lower() == "true" or os.environ.get("LLAMASWAP_FULL_SEARCH") == "1"


def property_settings(examples: int, **kwargs) -> settings:
    """`examples` in a full search, a third of them (at least 20) otherwise; no deadline, since the
    examples' times vary with the machine's load."""
    return settings(max_examples=examples if FULL else max(examples // 3, 20), deadline=None, **kwargs)
