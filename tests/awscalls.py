"""The AWS requests a test's botocore clients send, recorded in order, and checked against the
services' API models (the launcher's own check: launcher/apimodel.py)."""

from __future__ import annotations

from typing import Any

import pytest


class Calls:
    """The operations every botocore client sends, in order ("ec2.RunInstances")."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.params: list[dict] = []

    def __call__(self, model, params, **_) -> None:
        self.ops.append(f"{model.service_model.service_name}.{model.name}")
        self.params.append(params)


def on_every_client(monkeypatch: pytest.MonkeyPatch, event: str, handler: Any, *, first: bool = False) -> None:
    """Register `handler` for botocore `event` on every client made from now on (through infra.aws
    or not): how a test records or answers requests. `first`: before botocore's own handlers."""
    import botocore.session

    real = botocore.session.Session.create_client

    def create_client(self, *args, **kwargs):
        client = real(self, *args, **kwargs)
        (client.meta.events.register_first if first else client.meta.events.register)(event, handler)
        return client

    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)


@pytest.fixture
def calls(monkeypatch) -> Calls:
    """Every client made from now on records its requests here (import it into a test module to use it)."""
    seen = Calls()
    on_every_client(monkeypatch, "provide-client-params", seen)
    return seen


def requests_pass_the_api_model(calls: Calls, operations: set[str]) -> None:
    """`operations` were sent, and every request of theirs is one the service's API model accepts."""
    from distrain_cloud.launcher import apimodel

    sent = [(op, params) for op, params in zip(calls.ops, calls.params, strict=True) if op in operations]
    assert {op for op, _ in sent} == operations
    for op, params in sent:
        service, operation = op.split(".")
        assert apimodel.problems(service, operation, params) == [], op
