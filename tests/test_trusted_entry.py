"""rocforge_build/trusted_entry.py: a substitute.trusted_keys entry (a key, its window, the key it
came through) read strictly, and its times; signing.trusted_keys_from_config's windows cut along
a chain of via; signing.trust_problem's rule at the edges of a window and a revocation."""

from __future__ import annotations

import calendar
import time

import pytest

from rocforge_build import config
from rocforge_build.errors import ConfigError
from rocforge_build.substitute import signing
from rocforge_build.trusted_entry import format_time, parse, parse_all, parse_time

A, B, C = (signing.generate() for _ in range(3))


@pytest.mark.parametrize("text", ["1970-01-01", "2000-02-29", "2026-11-29T08:35:00Z", "9999-12-31T23:59:59Z",
                                  "2024-12-31T00:00:00Z", "2100-03-01"])
def test_times_agree_with_the_c_library(text):
    full = text if "T" in text else text + "T00:00:00Z"
    assert parse_time(text) == calendar.timegm(time.strptime(full, "%Y-%m-%dT%H:%M:%SZ"))
    assert format_time(parse_time(text)) == full


@pytest.mark.parametrize("text", ["2026-02-30", "2100-02-29", "2026-13-01", "2026-11-29T24:00:00Z",
                                  "2026-11-29T08:35:00", "2026-11-29T08:35:00+00:00", "2026-11-29 08:35:00Z",
                                  "2026-11-29T08:35:00.5Z", "1969-12-31", "+2026-01-01", "26-01-01", "",
                                  "２０２６-01-01", "2026-1-1"])
def test_a_time_that_is_not_strictly_utc_is_refused(text):
    with pytest.raises(ValueError):
        parse_time(text)


def test_a_plain_entry_keeps_its_meaning():
    entry = parse(A.public.text)
    assert (entry.key_text, entry.not_before, entry.not_after, entry.via) == (A.public.text, None, None, None)
    (key,) = signing.trusted_keys_from_config([A.public.text])
    assert key == A.public and (key.not_before, key.not_after, key.via, key.revoked) == (None, None, (), None)


def test_options_are_read_strictly():
    entry = parse(f"{A.public.text} not-before=2026-01-01 not-after=2027-01-01T12:00:00Z via={B.key_id}")
    assert (entry.not_before, entry.not_after, entry.via) == (
        parse_time("2026-01-01"), parse_time("2027-01-01T12:00:00Z"), B.key_id)
    for bad, why in ((f"{A.public.text} notbefore=2026-01-01", "after the key come only"),
                     (f"{A.public.text}  not-before=2026-01-01", "after the key come only"),
                     (f"{A.public.text} not-before=2026-01-01 not-before=2026-01-02", "twice"),
                     (f"{A.public.text} not-before=2027-01-01 not-after=2026-01-01", "no time is inside"),
                     (f"{A.public.text} not-before=2026-01-01 not-after=2026-01-01", "no time is inside"),
                     (f"{A.public.text} via=abc", "not a key id"),
                     (f"{A.public.text} via={B.key_id.lower()}", "not a key id"),
                     (f"{A.public.text}\tnot-before=2026-01-01", "not base64"),
                     (f"not-before=2026-01-01 {A.public.text}", "not base64"),
                     (A.public.text + " x" * 300, "more than 512")):
        with pytest.raises(ValueError, match=why):
            parse(bad)


def test_via_must_name_an_entry_and_never_loop():
    a, b, c = A.public.text, B.public.text, C.public.text
    parse_all([a, f"{b} via={A.key_id}", f"{c} via={B.key_id}"])
    with pytest.raises(ValueError, match=r"\[1\] is trusted via the key"):
        parse_all([a, f"{b} via={C.key_id}"])
    with pytest.raises(ValueError, match="loops"):
        parse_all([f"{a} via={B.key_id}", f"{b} via={A.key_id}"])
    with pytest.raises(ValueError, match="loops"):
        parse_all([f"{a} via={A.key_id}"])
    with pytest.raises(ValueError, match="loops"):
        parse_all([f"{a} via={C.key_id}", f"{b} via={A.key_id}", f"{c} via={B.key_id}"])


def test_config_set_refuses_a_bad_entry_in_one_line_and_keeps_the_file(capsys):
    config.set_value("substitute.trusted_keys", [A.public.text])
    for value in ([f"{A.public.text} not-after=2026-02-30"], [f"{A.public.text} via={B.key_id}"],
                  [f"{A.public.text} via={A.key_id}"], [f"{A.public.text} expires=2027-01-01"]):
        with pytest.raises(ConfigError) as exc:
            config.set_value("substitute.trusted_keys", value)
        assert "\n" not in exc.value.message and "substitute.trusted_keys" in exc.value.message
    assert config.get("substitute.trusted_keys") == [A.public.text]


def test_a_chain_never_grants_more_than_the_key_it_came_through():
    keys = signing.trusted_keys_from_config([
        f"{A.public.text} not-before=2026-01-01 not-after=2027-01-01",
        f"{B.public.text} not-before=2025-01-01 not-after=2030-01-01 via={A.key_id}",
        f"{C.public.text} not-before=2026-06-01 via={B.key_id}"])
    a, b, c = keys
    assert (b.not_before, b.not_after, b.via) == (parse_time("2026-01-01"), parse_time("2027-01-01"), (A.key_id,))
    assert (c.not_before, c.not_after, c.via) == (parse_time("2026-06-01"), parse_time("2027-01-01"),
                                                  (B.key_id, A.key_id))
    # windows that do not meet: trusted at no time
    (_, d) = signing.trusted_keys_from_config([f"{A.public.text} not-after=2026-01-01",
                                               f"{B.public.text} not-before=2026-06-01 via={A.key_id}"])
    assert "at no time" in signing.trust_problem(d, None, now=parse_time("2026-07-01"))


def test_the_window_is_half_open_and_covers_now_and_the_claimed_time():
    (key,) = signing.trusted_keys_from_config([f"{A.public.text} not-before=2026-01-01 not-after=2027-01-01"])
    start, end = parse_time("2026-01-01"), parse_time("2027-01-01")
    mid = start + 1000
    assert signing.trust_problem(key, None, now=start) is None
    assert signing.trust_problem(key, start, now=end - 1) is None
    assert "now is outside" in signing.trust_problem(key, None, now=start - 1)
    assert "now is outside" in signing.trust_problem(key, mid, now=end)  # expired: nothing it signed
    assert "the signing time it claims" in signing.trust_problem(key, start - 1, now=mid)
    assert "in the future" in signing.trust_problem(key, mid + signing.CLOCK_SKEW + 1, now=mid)
    assert signing.trust_problem(key, mid + signing.CLOCK_SKEW, now=mid) is None  # two clocks disagree
    assert signing.trust_problem(A.public, start - 10**9, now=0) is None  # a plain key: no rule


def test_a_revocation_ends_trust_from_its_time_or_always():
    (key,) = signing.trusted_keys_from_config([A.public.text])
    at = parse_time("2026-06-01")
    retired = signing.Revocation(A.key_id, "retired", at, "sha256:" + "1" * 64, "file:///s")
    compromised = signing.Revocation(A.key_id, "compromised", at, "sha256:" + "2" * 64, "file:///s")
    from dataclasses import replace

    r, c = replace(key, revoked=retired), replace(key, revoked=compromised)
    now = at + 86400
    assert signing.trust_problem(r, at - 1, now=now) is None
    assert "not before it" in signing.trust_problem(r, at, now=now)  # from its time, inclusive
    assert "claims no time" in signing.trust_problem(r, None, now=now)
    for claimed in (None, at - 10**6, at):
        line = signing.trust_problem(c, claimed, now=now)
        assert "compromised" in line and "sha256:222222222222" in line and "file:///s" in line
