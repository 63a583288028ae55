"""`filters.stripParams` / `filters.setParams` and ModelFilters.apply."""

from hypothesis import given
from hypothesis import strategies as st

from proxy.config import ModelFilters
from proxy.config.frozen import freeze


def test_filters_are_read_and_model_is_protected(load):
    config = load(
        """
        models:
          m:
            cmd: a
            proxy: http://h:1
            filters:
              stripParams: "temperature, top_p ,, model, top_k"
              setParams:
                model: other
                temperature: 0.7
                provider: {zdr: true, order: [a, b]}
        """
    )
    filters = config.models["m"].filters
    assert filters.strip_params == ("temperature", "top_p", "top_k")
    assert filters.set_params == {"temperature": 0.7, "provider": {"zdr": True, "order": ("a", "b")}}
    assert any("models.m.filters.stripParams" in w and "protected" in w for w in config.warnings)
    assert any("models.m.filters.setParams.model" in w and "useModelName" in w for w in config.warnings)


def test_legacy_strip_params_spelling(load):
    filters = load("models: {m: {cmd: a, proxy: 'http://h:1', filters: {strip_params: 'a, b'}}}").models["m"].filters
    assert filters.strip_params == ("a", "b")


def test_set_params_must_be_a_mapping(config_error, problem):
    error = config_error("models: {m: {cmd: a, proxy: 'http://h:1', filters: {setParams: [a]}}}")
    assert "setParams: {temperature: 0.7}" in problem(error, "models.m.filters.setParams")


def test_apply_strips_then_sets_and_returns_a_new_dict():
    filters = ModelFilters(strip_params=("top_p", "temperature"), set_params=freeze({"temperature": 0.2, "extra": {"k": [1]}}))
    body = {"model": "m", "top_p": 0.9, "temperature": 1.0, "messages": []}
    result = filters.apply(body)
    assert result == {"model": "m", "temperature": 0.2, "messages": [], "extra": {"k": [1]}}
    assert body == {"model": "m", "top_p": 0.9, "temperature": 1.0, "messages": []}
    result["extra"]["k"].append(2)  # the result is the caller's to change
    assert filters.set_params["extra"]["k"] == (1,)


def test_apply_never_touches_model_even_when_asked_to():
    filters = ModelFilters(strip_params=("model",), set_params=freeze({"model": "evil"}))
    assert filters.apply({"model": "m"}) == {"model": "m"}


def test_empty_filters():
    assert ModelFilters().is_empty
    assert not ModelFilters(strip_params=("a",)).is_empty
    assert ModelFilters().apply({"model": "m", "x": 1}) == {"model": "m", "x": 1}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(
    body=st.dictionaries(st.text(max_size=6), json_values, max_size=6),
    strip=st.lists(st.text(max_size=6), max_size=4),
    set_params=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
)
def test_apply_properties(body, strip, set_params):
    filters = ModelFilters(strip_params=tuple(strip), set_params=freeze(set_params))
    result = filters.apply(body)
    assert result.get("model") == body.get("model")
    assert ("model" in result) == ("model" in body)
    for key in strip:
        if key != "model" and key not in set_params:
            assert key not in result
    for key, value in set_params.items():
        if key != "model":
            assert result[key] == value
    for key, value in body.items():
        if key not in strip and key not in set_params:
            assert result[key] == value
