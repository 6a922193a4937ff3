"""Check a planned request against the AWS API model before anything is sent.

botocore's client validates types and minimums only, and moto checks nothing, so a request
can pass every local test and still be refused by the service (a 547-character
ContainerEntrypoint item once was). This walks the operation's input shape from botocore's
bundled service model and checks what the service checks: required members, unknown members,
string lengths and patterns, enums, list and map sizes, and numeric ranges. Patterns are
matched whole, as the services do, with the `regex` module because the models use Java's
`\\p{...}` classes. Service limits that the model does not carry (SageMaker's 28-day runtime)
are added per operation in EXTRA_LIMITS.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

# Limits documented by the service but absent from botocore's model: (path, maximum, unit).
EXTRA_LIMITS: dict[tuple[str, str], list[tuple[str, int, str]]] = {
    ("sagemaker", "CreateTrainingJob"): [
        ("StoppingCondition.MaxRuntimeInSeconds", 28 * 86400, "seconds (28 days)"),
    ],
}


@functools.lru_cache(maxsize=8)
def _service(service: str) -> Any:
    # The bundled model straight from botocore's loader: a session would read the user's AWS
    # config first, and a plan must not fail on a missing AWS_PROFILE before saying so itself.
    # Read once per service: EC2's takes 50 ms to read, and one EC2 plan checks several of its
    # requests (read once per operation, they were 0.55 s of its 0.7 s).
    from botocore.loaders import create_loader
    from botocore.model import ServiceModel

    return ServiceModel(create_loader().load_service_model(service, "service-2"), service_name=service)


@functools.lru_cache(maxsize=64)
def _operation(service: str, operation: str) -> Any:
    return _service(service).operation_model(operation)


@functools.lru_cache(maxsize=512)
def _pattern(pattern: str) -> Callable[[str], Any]:
    import regex

    # Java writes the supplementary planes as a range of surrogate pairs (EC2 Auto Scaling's name
    # patterns do); Python's strings hold those characters whole.
    pattern = pattern.replace("\\uD800\\uDC00-\\uDBFF\\uDFFF", "\\U00010000-\\U0010FFFF")
    matcher: Callable[[str], Any] = regex.compile(pattern).fullmatch
    return matcher


def problems(service: str, operation: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """Every way `params` breaks the API model of `service`.`operation`, as (path, problem).

    Paths name request fields the way the API documentation does: `Tags[2].Key`,
    `HyperParameters["lr"]`, `AlgorithmSpecification.ContainerEntrypoint[2]`."""
    found = list(_walk(_operation(service, operation).input_shape, params, ""))
    for path, maximum, unit in EXTRA_LIMITS.get((service, operation), []):
        value: Any = params
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, (int, float)) and value > maximum:
            found.append((path, f"{value} is above the service's limit of {maximum} {unit}"))
    return found


def _walk(shape: Any, value: Any, path: str) -> Iterator[tuple[str, str]]:
    kind, meta = shape.type_name, shape.metadata
    if kind == "structure":
        if not isinstance(value, dict):
            yield path, f"must be an object, not {type(value).__name__}"
            return
        for name in shape.required_members:
            if value.get(name) is None:
                yield _join(path, name), "is required"
        for name, member in value.items():
            if name not in shape.members:
                yield _join(path, name), "is not a field of this request"
            elif member is not None:
                yield from _walk(shape.members[name], member, _join(path, name))
    elif kind == "list":
        if not isinstance(value, (list, tuple)):
            yield path, f"must be a list, not {type(value).__name__}"
            return
        yield from _size(path, len(value), meta, "items")
        for i, item in enumerate(value):
            yield from _walk(shape.member, item, f"{path}[{i}]")
    elif kind == "map":
        if not isinstance(value, dict):
            yield path, f"must be a mapping, not {type(value).__name__}"
            return
        yield from _size(path, len(value), meta, "entries")
        for key, item in value.items():
            yield from _walk(shape.key, key, f"{path} key {key!r}")
            yield from _walk(shape.value, item, f"{path}[{key!r}]")
    elif kind == "string":
        if not isinstance(value, str):
            yield path, f"must be a string, not {type(value).__name__}"
            return
        yield from _size(path, len(value), meta, "characters")
        if shape.enum and value not in shape.enum:
            yield path, f"{value!r} is not one of the values the API accepts"
        elif "pattern" in meta and not _pattern(meta["pattern"])(value):
            yield path, f"{_short(value)} does not match the API's pattern {meta['pattern']}"
    elif kind in ("integer", "long", "float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            yield path, f"must be a number, not {type(value).__name__}"
            return
        if "min" in meta and value < meta["min"]:
            yield path, f"{value} is below the minimum {meta['min']}"
        if "max" in meta and value > meta["max"]:
            yield path, f"{value} is above the maximum {meta['max']}"
    elif kind == "boolean" and not isinstance(value, bool):
        yield path, f"must be true or false, not {type(value).__name__}"


def _size(path: str, n: int, meta: dict[str, Any], unit: str) -> Iterator[tuple[str, str]]:
    if "min" in meta and n < meta["min"]:
        yield path, f"has {n} {unit}; the API needs at least {meta['min']}"
    if "max" in meta and n > meta["max"]:
        yield path, f"has {n} {unit}; the API allows at most {meta['max']}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _short(value: str, limit: int = 60) -> str:
    return repr(value) if len(value) <= limit else repr(value[:limit]) + "..."
