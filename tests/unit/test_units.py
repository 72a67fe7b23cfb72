"""Human units are parsed once, at the edge, into SI numbers."""
from __future__ import annotations

import math

import pytest

from compiler import units


@pytest.mark.parametrize("text,value", [
    ("70B", 70_000_000_000), ("15T", 15 * 10**12), ("1.5M", 1_500_000), (8192, 8192), ("8_192", 8192),
    ("405.9B", 405_900_000_000), ("2k", 2000), ("1e3", 1000),
])
def test_parse_count(text, value):
    assert units.parse_count(text) == value


@pytest.mark.parametrize("text,value", [
    ("80GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("512MiB", 512 * 2**20), ("1.5TiB", int(1.5 * 2**40)), (1024, 1024),
])
def test_parse_bytes(text, value):
    assert units.parse_bytes(text) == value


@pytest.mark.parametrize("text,value", [
    ("400Gb/s", 50e9), ("900GB/s", 900e9), ("3.35TB/s", 3.35e12), ("200Gbps", 25e9), ("100 Gbit/s", 12.5e9),
])
def test_parse_bandwidth(text, value):
    assert units.parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("$2.5M", 2.5e6), ("$800K", 8e5), ("2.49", 2.49), ("$1,200", 1200.0)])
def test_parse_money(text, value):
    assert units.parse_money(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("30d", 30 * 86400), ("12h", 43200), ("90min", 5400), ("2w", 1209600), (60, 60)])
def test_parse_duration(text, value):
    assert units.parse_duration(text) == value


def test_parse_flops():
    assert units.parse_flops("989TFLOPS") == pytest.approx(989e12)
    assert units.parse_flops("1.2PFLOPS") == pytest.approx(1.2e15)


@pytest.mark.parametrize("parser,bad", [
    (units.parse_count, "15Q"), (units.parse_count, "1.5"), (units.parse_count, True), (units.parse_count, "nan"),
    (units.parse_count, float("inf")), (units.parse_bytes, "80 gigs"), (units.parse_bandwidth, "400G"),
    (units.parse_money, "2.5 million"), (units.parse_duration, "3 fortnights"), (units.parse_count, [1]),
])
def test_bad_units_say_what_is_expected(parser, bad):
    with pytest.raises(units.UnitError) as exc:
        parser(bad)
    assert exc.value.expected


def test_formatting_and_rounding():
    assert units.format_bytes(80 * 2**30) == "80.0 GiB"
    assert units.format_count(70.55e9) == "70.55B"
    assert units.format_seconds(10800) == "3.0 h"
    assert units.format_seconds(5400) == "90.0 min"
    assert units.format_money(2.5e6) == "$2.50M"
    assert units.round_sig(123456.789, 4) == 123500
    assert units.round_sig(0.000123456, 4) == 0.0001235
    assert math.isnan(units.round_sig(float("nan")))
