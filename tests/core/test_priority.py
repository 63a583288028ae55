"""The X-LlamaSwap-Priority header and bands, as the request-priority spec states them."""

import pytest

from scheduling.core import BAND_SPACING, PRIORITY_ALIASES, PRIORITY_HEADER, Band, band_of, parse_priority


def test_header_name_and_anchors():
    assert PRIORITY_HEADER == "X-LlamaSwap-Priority"
    assert PRIORITY_ALIASES == {"interactive": 100, "normal": 0, "batch": -100}
    assert BAND_SPACING == 100


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", 0),
        ("100", 100),
        ("-100", -100),
        ("+5", 5),
        ("-98", -98),
        ("007", 7),
        ("123456789", 123456789),
        ("  42\t", 42),
        ("\r\n-3 ", -3),
    ],
)
def test_signed_integers_are_taken_as_is(raw, expected):
    assert parse_priority(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("interactive", 100),
        ("normal", 0),
        ("batch", -100),
        ("INTERACTIVE", 100),
        ("Batch", -100),
        ("  interactive  ", 100),
        ("\tNormal\n", 0),
    ],
)
def test_aliases_are_case_insensitive_and_ignore_surrounding_whitespace(raw, expected):
    assert parse_priority(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "   ",
        "1.5",
        "1e3",
        "1.0",
        "garbage",
        "high",
        "١٢",  # Arabic-Indic digits: int() would accept them
        "+ 5",
        "- 5",
        "0x10",
        "1_0",
        "++5",
        "5-",
        "interactive!",
        "inter active",
        "100 200",
        "\u00a05",  # non-breaking space is not HTTP whitespace
    ],
)
def test_absent_or_unparseable_means_normal(raw):
    assert parse_priority(raw) == 0


def test_values_within_signed_64_bits_are_not_clamped():
    assert parse_priority(str(2**63 - 1)) == 2**63 - 1
    assert parse_priority(str(-(2**63))) == -(2**63)
    assert parse_priority("1000000") == 1000000


def test_values_outside_signed_64_bits_mean_normal():
    assert parse_priority(str(2**63)) == 0
    assert parse_priority(str(-(2**63) - 1)) == 0
    assert parse_priority("9" * 400) == 0


def test_header_bytes_are_read_as_latin1():
    assert parse_priority(b"-100") == -100
    assert parse_priority(b" Interactive ") == 100
    assert parse_priority(b"\xff\xfe") == 0
    assert parse_priority(b"\xd9\xa1") == 0  # UTF-8 for an Arabic-Indic digit
    assert parse_priority(b"") == 0


@pytest.mark.parametrize(
    ("priority", "band"),
    [
        (100, Band.INTERACTIVE),
        (101, Band.INTERACTIVE),  # interactive + a tier offset
        (50, Band.INTERACTIVE),
        (49, Band.NORMAL),
        (0, Band.NORMAL),
        (2, Band.NORMAL),
        (-49, Band.NORMAL),
        (-50, Band.BATCH),
        (-98, Band.BATCH),  # max member's batch job: -100 + 2
        (-99, Band.BATCH),
        (-100, Band.BATCH),
        (-(2**63), Band.BATCH),
        (2**63 - 1, Band.INTERACTIVE),
        (49.5, Band.NORMAL),
    ],
)
def test_band_of(priority, band):
    assert band_of(priority) is band


def test_tier_offsets_order_within_a_band_but_stay_below_normal():
    free, pro, max_ = -100, -100 + 1, -100 + 2
    assert max_ > pro > free
    assert all(band_of(p) is Band.BATCH for p in (free, pro, max_))
    assert all(p < 0 for p in (free, pro, max_))


def test_band_values_are_metric_labels():
    assert [str(b) for b in Band] == ["interactive", "normal", "batch"]


def test_a_10_kilobyte_number_is_out_of_range_not_an_error():
    assert parse_priority("9" * 10_000) == 0
    assert parse_priority("-" + "1" * 5_000) == 0
    assert parse_priority("0" * 5_000 + "42") == 42
