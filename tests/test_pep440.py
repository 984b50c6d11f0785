"""pairctl.engine.pep440 against the reference implementation (``packaging``, which the
test venv has through pip's and vLLM's dependencies): every version x specifier pair of a
grid built from the versions preflight really meets."""

from __future__ import annotations

import itertools

import pytest

from pairctl.engine import pep440

packaging = pytest.importorskip("packaging.specifiers")
from packaging.version import Version as RefVersion  # noqa: E402

VERSIONS = [
    "2.28.9",
    "2.28.9.0",
    "2.28.10",
    "2.28",
    "2.30.0",
    "2.30.7",
    "2.30.0rc1",
    "2.30.0.dev3",
    "2.30.0a2",
    "2.30.0.post1",
    "2.13.0+cpu",
    "2.13.0",
    "2.14.0",
    "2.14.0+cu130",
    "2.10.0a0+git1234abc",
    "0.21.1rc1.dev339+g1967a5627bc3",
    "0.21.1",
    "0.27.1",
    "0.33.0",
    "4.6.0",
    "4.6",
    "4.6.0.post2",
    "4.8.0",
    "1!1.0",
    "1.0-1",
    "1.0.RC1",
    "1.0alpha2",
]
SPECS = [
    "==2.28.9",
    "!=2.28.9",
    "<2.30",
    "<2.30.0",
    "<=2.30",
    ">2.30",
    ">=2.30,<2.31",
    "==2.28.*",
    "!=2.30.*",
    "~=2.28.0",
    "~=2.30",
    "==2.13.0",
    "==2.13.0+cpu",
    "==4.6.0",
    ">4.6.0",
    "<4.6.0",
    "==0.21.1rc1.dev339+g1967a5627bc3",
    ">=0.21.1rc1",
    "<0.22",
    "==1.0rc1",
    ">1.0",
]


@pytest.mark.parametrize("a,b", list(itertools.combinations(VERSIONS, 2)))
def test_ordering_and_equality_agree_with_packaging(a: str, b: str) -> None:
    ours, ref = (pep440.parse(a), pep440.parse(b)), (RefVersion(a), RefVersion(b))
    assert (ours[0] < ours[1]) == (ref[0] < ref[1]), (a, b)
    assert (ours[0] == ours[1]) == (ref[0] == ref[1]), (a, b)


@pytest.mark.parametrize("spec", SPECS)
def test_specifiers_agree_with_packaging(spec: str) -> None:
    ref = packaging.SpecifierSet(spec, prereleases=True)
    for v in VERSIONS:
        assert pep440.contains(v, spec) == ref.contains(v, prereleases=True), (v, spec)


def test_normalised_spelling_prints_canonically() -> None:
    for raw in VERSIONS:
        assert str(pep440.parse(raw)) == str(RefVersion(raw)), raw


def test_matches_exact_specifier_and_plain_words() -> None:
    assert pep440.matches("2.28.9", "2.28.9.0")  # PEP 440 equality, not string equality
    assert pep440.matches("2.28.9", "==2.28.9")
    assert not pep440.matches("2.30.7", "==2.28.9")
    assert pep440.matches("missing", "missing")  # a probed property, not a version
    assert not pep440.matches("present", "missing")
    assert not pep440.matches("not-a-version", "<2.30")  # cannot compare: no match


def test_bad_input_is_an_error_not_a_guess() -> None:
    with pytest.raises(pep440.InvalidVersion):
        pep440.parse("2.28.9-wedge")
    with pytest.raises(pep440.InvalidVersion):
        pep440.contains("2.28.9", "=>2.28")
    with pytest.raises(pep440.InvalidVersion):
        pep440.contains("2.28.9", "~=2")


def test_check_specifiers_reads_every_part() -> None:
    pep440.check_specifiers(">=0.27.1,<0.34")
    for bad in (">=0.27.1,<<1", "0.27", "~=1", "<1.0+cpu"):
        with pytest.raises(pep440.InvalidVersion):
            pep440.check_specifiers(bad)
