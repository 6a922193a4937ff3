"""Every backend in the registry answers every question of the Backend protocol."""

from __future__ import annotations

import inspect

import pytest

from distrain_cloud.launcher.backends import BACKENDS, Backend, get_backend

QUESTIONS = sorted(name for name, value in vars(Backend).items() if inspect.isfunction(value) and name[0] != "_")
# Asked of cloud backends only: a local job's folder already holds what `report` reads (the
# protocol's docstring; cli.report asks only when the job's backend is not local).
NOT_ASKED = {"local": {"fetch_outputs"}}


def test_the_protocol_asks_what_the_floor_asks():
    # lease.py asks holder_state; cli.py the rest
    assert {"plan", "preflight", "submit", "status", "cancel", "holder_state", "fetch_outputs"} <= set(QUESTIONS)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_answers_every_question_with_the_protocols_parameters(name):
    backend = get_backend(name)
    assert backend.name == name
    for question in (q for q in QUESTIONS if q not in NOT_ASKED.get(name, set())):
        method = getattr(backend, question, None)
        assert callable(method), f"{name} has no {question}"
        asked = list(inspect.signature(getattr(Backend, question)).parameters)[1:]  # without self
        answered = inspect.signature(method).parameters
        assert all(p in answered for p in asked), f"{name}.{question} takes {list(answered)}, the protocol {asked}"
