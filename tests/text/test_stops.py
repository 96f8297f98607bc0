"""Stop strings cut exactly and are never partly emitted; deltas join to the final text."""

from __future__ import annotations

import pytest

from anatomy.text.stops import StopStringFilter


def run(pieces: list[str], stop: tuple[str, ...]) -> tuple[list[str], StopStringFilter]:
    f = StopStringFilter(stop)
    deltas = [f.push(p) for p in pieces]
    if not f.stopped:
        deltas.append(f.flush())
    return deltas, f


@pytest.mark.parametrize("pieces, stop, text", [
    (["Hello", " wor", "ld\nUs", "er: hi"], ("\nUser:",), "Hello world"),  # split over three pieces
    (["ab", "c", "STOP", "more"], ("STOP",), "abc"),
    (["xSTO", "Py"], ("STOP", "TOP"), "x"),  # the earliest match wins, whichever string
    (["aaa", "ab"], ("aab",), "aa"),  # overlapping prefixes: "aaaab"
    (["no stop ", "here"], ("zz",), "no stop here"),
    (["St", "o"], ("Stop",), "Sto"),  # a held-back prefix that never completes is emitted at the end
    (["你好", "，世界！", "😀结束"], ("结束",), "你好，世界！😀"),
])
def test_text_is_cut_before_the_first_stop_string(pieces, stop, text):
    deltas, f = run(pieces, stop)
    assert "".join(deltas) == text == f.text


def test_the_stop_string_that_matched_is_named():
    assert run(["xSTO", "Py"], ("STOP", "TOP"))[1].matched == "STOP", "the earliest match"
    assert run(["Hello", " wor", "ld\nUs", "er: hi"], ("zz", "\nUser:"))[1].matched == "\nUser:"
    assert run(["no stop"], ("zz",))[1].matched is None


def test_no_delta_ever_holds_part_of_a_stop_string():
    deltas, _ = run(["Hello\n", "U", "s", "e", "r", ":"], ("\nUser:",))
    assert deltas[0] == "Hello" and all(d == "" for d in deltas[1:])


def test_nothing_after_stopping():
    f = StopStringFilter(("END",))
    assert f.push("aEND") == "a" and f.stopped
    assert f.push("more") == "" and f.flush() == ""


def test_without_stop_strings_every_piece_passes_through():
    f = StopStringFilter()
    assert [f.push(p) for p in ["a", "b"]] == ["a", "b"]
