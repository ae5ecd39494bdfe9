"""slurm_gpushare.retry: a call tried again while its error is a passing one."""

from __future__ import annotations

import pytest

from slurm_gpushare.errors import InputError, SlurmError
from slurm_gpushare.retry import retry


class Flaky:
    """Fails with the given errors, in order, then answers."""

    def __init__(self, *errors: Exception):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "answer"


def test_a_passing_error_is_tried_again_after_each_wait():
    waited: list[float] = []
    call = Flaky(SlurmError("busy"), SlurmError("busy"))
    assert retry(call, waits=(0.5, 1.0), again=lambda e: isinstance(e, SlurmError), sleep=waited.append) == "answer"
    assert (call.calls, waited) == (3, [0.5, 1.0])


def test_the_first_success_ends_the_tries():
    waited: list[float] = []
    call = Flaky()
    assert retry(call, waits=(0.5, 1.0), again=lambda e: True, sleep=waited.append) == "answer"
    assert (call.calls, waited) == (1, [])


def test_the_last_error_is_raised_when_every_try_fails():
    call = Flaky(SlurmError("one"), SlurmError("two"), SlurmError("three"))
    with pytest.raises(SlurmError, match="three"):
        retry(call, waits=(0, 0), again=lambda e: True, sleep=lambda s: None)
    assert call.calls == 3


def test_an_error_not_worth_another_try_is_raised_at_once():
    waited: list[float] = []
    call = Flaky(InputError("bad"), SlurmError("busy"))
    with pytest.raises(InputError, match="bad"):
        retry(call, waits=(0.5, 1.0), again=lambda e: isinstance(e, SlurmError), sleep=waited.append)
    assert (call.calls, waited) == (1, [])


def test_no_waits_is_one_try():
    call = Flaky(SlurmError("busy"))
    with pytest.raises(SlurmError):
        retry(call, waits=(), again=lambda e: True, sleep=lambda s: None)
    assert call.calls == 1
