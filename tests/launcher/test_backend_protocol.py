"""Every backend in the registry answers every question of the Backend protocol."""

from __future__ import annotations

import inspect

import pytest

from distrain_cloud.launcher.backends import BACKENDS, Backend, get_backend

QUESTIONS = sorted(name for name, value in vars(Backend).items() if inspect.isfunction(value) and name[0] != "_")
# Asked of cloud backends only: a local job's folder already holds what `report` reads (the
# protocol's docstring; cli.report asks only when the job's backend is not local).
NOT_ASKED = {"local": {"fetch_outputs"}}


FACTS = {"name": str, "title": str, "billed": bool, "stops_now": bool, "finds_by_name": bool, "lease_fields": tuple}


def test_the_protocol_asks_what_the_floor_asks():
    # lease.py asks holder_state; jobs.py find; cli.py the rest
    asked = {"plan", "preflight", "submit", "status", "cancel", "holder_state", "find", "fetch_outputs"}
    assert asked <= set(QUESTIONS)
    assert FACTS.keys() <= Backend.__annotations__.keys()


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_states_the_facts_the_floor_reads(name):
    backend = get_backend(name)
    for fact, kind in FACTS.items():
        assert isinstance(getattr(backend, fact, None), kind), f"{name} does not say {fact} ({kind.__name__})"
    # lease.py checks each field a holder_state reads when it reads a lease back: it must know them
    from distrain_cloud.launcher.lease import _FIELDS

    assert backend.lease_fields and set(backend.lease_fields) <= _FIELDS.keys()


def test_a_backend_that_cannot_stop_at_once_refuses_now_naming_those_that_can():
    from distrain_cloud.infra.errors import UserError
    from distrain_cloud.launcher.plan import JobRef

    takers = sorted(get_backend(n).title for n in BACKENDS if get_backend(n).stops_now)
    assert takers  # else --now means nothing anywhere
    for name in (n for n in BACKENDS if not get_backend(n).stops_now):
        with pytest.raises(UserError) as refused:  # before any request: no AWS is set up here
            get_backend(name).cancel(JobRef("job-1", name, "us-east-1"), now=True)
        assert str(refused.value).startswith("--now applies to ") and all(t in str(refused.value) for t in takers)


def test_an_unknown_backend_is_refused_naming_each_backend_and_the_instance_that_picks_it():
    """get_backend's refusal is built from the registry and each backend's facts, as refuse_now's
    is: a new backend is named there without a line of its own."""
    from distrain_cloud.infra.errors import UserError
    from distrain_cloud.launcher.spec import INSTANCE_EXAMPLES, inferred_backend

    with pytest.raises(UserError) as refused:
        get_backend("batch")
    said = str(refused.value)
    assert said.startswith(f"unknown backend 'batch'; choose one of: {', '.join(BACKENDS)}, or let the instance")
    for name in BACKENDS:
        assert f"{INSTANCE_EXAMPLES[name]} for {get_backend(name).title}" in said
        # each example picks the backend it is given for
        assert inferred_backend(INSTANCE_EXAMPLES[name].removeprefix("--instance ")) == name


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
