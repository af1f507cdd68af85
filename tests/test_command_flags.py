"""The commands' numeric flags: a count below its minimum, a size or time that is not above 0, or a word
where a number belongs exits 2 with argparse's message naming the flag, before anything runs."""
from __future__ import annotations

import argparse

import pytest

from grpo.check import main as check_main
from grpo.cli import positive_number, whole_number
from grpo.profile import main as profile_main
from grpo.tune import main as tune_main

COMMANDS = {"check": check_main, "tune": tune_main, "profile": profile_main}
BAD = [
    ("check", "--prompt-tokens", "0", "a whole number of at least 1"),
    ("check", "--budget-gib", "-1", "a number above 0"),
    ("tune", "--run-steps", "-3", "a whole number of at least 1"),
    ("tune", "--steps", "0", "a whole number of at least 1"),
    ("tune", "--prompt-tokens", "many", "a whole number of at least 1"),
    ("tune", "--questions", "-1", "a whole number of at least 0"),
    ("tune", "--budget-gib", "0", "a number above 0"),
    ("tune", "--trials-s", "inf", "a number above 0"),
    ("profile", "--steps", "0", "a whole number of at least 1"),
    ("profile", "--budget-gib", "nan", "a number above 0"),
    ("profile", "--timeout-s", "-5", "a number above 0"),
]


@pytest.mark.parametrize("command,flag,value,expected", BAD)
def test_a_bad_number_exits_2_naming_the_flag(command, flag, value, expected, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        COMMANDS[command](["--params", str(tmp_path / "params.yaml"), flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: expected {expected}, got {value!r}" in capsys.readouterr().err


def test_the_types_accept_their_range_and_nothing_below_it():
    at_least_one = whole_number(1)
    assert at_least_one("1") == 1 and at_least_one("64") == 64 and whole_number(0)("0") == 0
    assert positive_number("7.5") == 7.5 and positive_number("1e-3") == 0.001
    for parse, text in [(at_least_one, "0"), (at_least_one, "1.5"), (whole_number(0), "-1"),
                        (positive_number, "0"), (positive_number, "-0.1"), (positive_number, "nan")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
