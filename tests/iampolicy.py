"""An IAM policy evaluator for tests: what AWS decides that moto does not.

moto enforces an assumed role's inline policy on S3 object ARNs, but it never applies a
permissions boundary, checks other services against resource "*", and ignores `ForAllValues`,
`StringLike`, `s3:prefix` and the `?` wildcard (its matcher raises on `??????`). This module plays
the part of IAM's evaluation that the tests rely on, as the IAM User Guide writes it:

- "Policy evaluation logic" ("Determining whether a request is allowed or denied within an
  account"): an explicit Deny in any policy wins; otherwise the request needs an Allow in the
  identity policies, and, when the principal has a permissions boundary, an Allow in the boundary
  too ("Permissions boundaries for IAM entities": the effective permissions are the intersection).
  A trust policy is evaluated as the resource-based policy it is, for `sts:AssumeRole`.
- "IAM JSON policy elements: Action / Resource / NotAction / NotResource": actions match
  case-insensitively with `*` and `?`; resources match as ARNs ("ArnLike": each of the six
  colon-separated parts on its own, case-sensitively, `*` and `?` within a part, the last part
  holding the rest of the ARN).
- "IAM JSON policy elements: Condition operators": every operator of a statement and every key of
  an operator must hold (AND); the values listed for one key are alternatives (OR). A key absent
  from the request makes a condition false, except for the negated operators (`StringNotEquals`,
  `StringNotLike`, `ArnNotEquals`, `ArnNotLike`: true), `...IfExists` (true) and `Null`. Condition
  key names are case-insensitive, values case-sensitive.
- "Single-valued vs. multivalued context keys": `ForAllValues:` is true when every value of the
  request's key matches some policy value, and when the key is absent or empty; `ForAnyValue:` when
  at least one does, false when absent. A single-valued operator on a multivalued key is refused
  here (IAM's answer then depends on the key; no test should lean on it).
- "IAM policy elements: Variables and tags", "Special characters": `${*}`, `${?}`, `${$}` are the
  literal characters; `${key}` is the request's value of a key (a statement whose variable has no
  value matches nothing).

Not played: service control, resource control and session policies, cross-account rules, NotPrincipal,
Numeric/Date/IpAddress/Binary operators, and resource-based policies granting a role session on
their own (none of the stack's policies do).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALLOW, EXPLICIT_DENY, IMPLICIT_DENY = "allow", "explicit deny", "implicit deny"
Value = str | bool | int | Sequence[str]


@dataclass(frozen=True)
class Request:
    """One authorization: an action on a resource, with the request's context keys."""

    action: str
    resource: str
    context: Mapping[str, Value] = field(default_factory=dict)
    principal: Mapping[str, str] = field(default_factory=dict)  # for a trust policy: {"Service": ...}

    def value(self, key: str) -> Value | None:
        wanted = key.lower()
        for name, value in self.context.items():
            if name.lower() == wanted:
                return value
        return None


def decide(request: Request, identity: Iterable[dict[str, Any]], boundary: dict[str, Any] | None = None) -> str:
    """ALLOW, EXPLICIT_DENY or IMPLICIT_DENY for `request` made by a principal whose identity
    policies are `identity` and whose permissions boundary is `boundary` (None: it has none)."""
    identity = list(identity)
    everything = identity + ([boundary] if boundary is not None else [])
    if any(_matches(s, request) for p in everything for s in _statements(p) if s["Effect"] == "Deny"):
        return EXPLICIT_DENY
    if boundary is not None and not _allows(boundary, request):
        return IMPLICIT_DENY  # the boundary caps what the identity policies may grant
    return ALLOW if any(_allows(p, request) for p in identity) else IMPLICIT_DENY


def allowed(request: Request, identity: Iterable[dict[str, Any]], boundary: dict[str, Any] | None = None) -> bool:
    return decide(request, identity, boundary) == ALLOW


def trusts(trust: dict[str, Any], request: Request) -> bool:
    """Whether trust policy `trust` lets `request.principal` assume the role (`request.action`
    is sts:AssumeRole, `request.resource` the role's ARN)."""
    statements = [s for s in _statements(trust) if _principal_matches(s.get("Principal"), request.principal)]
    if any(_matches(s, request) for s in statements if s["Effect"] == "Deny"):
        return False
    return any(_matches(s, request) for s in statements if s["Effect"] == "Allow")


# --- statements -----------------------------------------------------------------------------------


def _statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    statements = policy["Statement"]
    return [statements] if isinstance(statements, dict) else list(statements)


def _allows(policy: dict[str, Any], request: Request) -> bool:
    return any(_matches(s, request) for s in _statements(policy) if s["Effect"] == "Allow")


def _listed(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _matches(statement: dict[str, Any], request: Request) -> bool:
    if "Action" in statement:
        if not any(_action_matches(a, request.action) for a in _listed(statement["Action"])):
            return False
    elif any(_action_matches(a, request.action) for a in _listed(statement["NotAction"])):
        return False
    if "Resource" in statement:
        if not any(_resource_matches(r, request) for r in _listed(statement["Resource"])):
            return False
    elif any(_resource_matches(r, request) for r in _listed(statement.get("NotResource", []))):
        return False
    return all(
        _condition(operator, key, values, request)
        for operator, block in statement.get("Condition", {}).items()
        for key, values in block.items()
    )


def _principal_matches(principal: Any, wanted: Mapping[str, str]) -> bool:
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        return False
    return any(v in _listed(principal.get(kind, [])) for kind, v in wanted.items())


def _action_matches(pattern: str, action: str) -> bool:
    return _wildcard(pattern.lower(), literal_escapes=False).fullmatch(action.lower()) is not None


def _resource_matches(pattern: str, request: Request) -> bool:
    expanded = _expand(pattern, request)
    return expanded is not None and _arn_like(expanded, request.resource)


# --- matching -------------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LITERALS = {"*": "\0star\0", "?": "\0question\0", "$": "$"}


def _expand(pattern: str, request: Request) -> str | None:
    """`pattern` with `${key}` replaced by the request's value; `${*}`, `${?}` kept as literal
    markers. None when a variable has no value (the statement then matches nothing)."""
    missing = False

    def replace(m: re.Match[str]) -> str:
        nonlocal missing
        name = m.group(1)
        if name in _LITERALS:
            return _LITERALS[name]
        value = request.value(name)
        if not isinstance(value, str):
            missing = True
            return ""
        return value.replace("*", _LITERALS["*"]).replace("?", _LITERALS["?"])  # a value is never a wildcard

    expanded = _VARIABLE.sub(replace, pattern)
    return None if missing else expanded


def _wildcard(pattern: str, *, literal_escapes: bool = True, star: str = ".*", one: str = ".") -> re.Pattern[str]:
    out = []
    for char in re.split(r"(\0star\0|\0question\0|[*?])", pattern):
        if char == "*":
            out.append(star)
        elif char == "?":
            out.append(one)
        elif literal_escapes and char == _LITERALS["*"]:
            out.append(re.escape("*"))
        elif literal_escapes and char == _LITERALS["?"]:
            out.append(re.escape("?"))
        else:
            out.append(re.escape(char))
    return re.compile("".join(out), re.DOTALL)


def _string_like(pattern: str, value: str) -> bool:
    return _wildcard(pattern).fullmatch(value) is not None


def _arn_like(pattern: str, arn: str) -> bool:
    if pattern == "*":
        return True
    wanted, actual = pattern.split(":", 5), arn.split(":", 5)
    if len(wanted) != 6 or len(actual) != 6:
        return False
    # Within each of the first five parts a wildcard does not cross a colon; the sixth holds the rest.
    return all(
        _wildcard(w, star="[^:]*" if i < 5 else ".*", one="[^:]" if i < 5 else ".").fullmatch(a) is not None
        for i, (w, a) in enumerate(zip(wanted, actual, strict=True))
    )


def _plain(value: str) -> str:
    return value.replace(_LITERALS["*"], "*").replace(_LITERALS["?"], "?")


def _compare(operator: str, policy_value: str, value: str) -> bool:
    if operator == "StringEquals":
        return _plain(policy_value) == value
    if operator == "StringEqualsIgnoreCase":
        return _plain(policy_value).lower() == value.lower()
    if operator == "StringLike":
        return _string_like(policy_value, value)
    if operator == "ArnEquals":
        return _arn_like(policy_value.replace("*", _LITERALS["*"]).replace("?", _LITERALS["?"]), value)
    if operator == "ArnLike":
        return _arn_like(policy_value, value)
    if operator == "Bool":
        return policy_value.lower() == value.lower()
    raise ValueError(f"condition operator {operator} is not played by tests/iampolicy.py")


_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}


def _condition(operator: str, key: str, values: Any, request: Request) -> bool:
    policy_values = [str(v).lower() if isinstance(v, bool) else str(v) for v in _listed(values)]
    value = request.value(key)
    if operator == "Null":  # "true": the key is absent; "false": it is present
        return (value is None) == (policy_values[0].lower() == "true")
    qualifier, _, operator = operator.rpartition(":")
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    negated = operator in _NEGATED
    base = _NEGATED.get(operator, operator)
    expanded = [_expand(v, request) for v in policy_values]
    candidates = [v for v in expanded if v is not None]

    def one(actual: str) -> bool:
        hit = any(_compare(base, v, actual) for v in candidates)
        return not hit if negated else hit

    actual = [] if value is None else [_text(v) for v in _listed_value(value)]
    if qualifier == "ForAllValues":
        return all(one(v) for v in actual)  # true for an absent or empty key
    if qualifier == "ForAnyValue":
        return any(one(v) for v in actual)  # false for an absent key
    if qualifier:
        raise ValueError(f"condition qualifier {qualifier} is not IAM's")
    if value is None:
        return if_exists or negated
    if not isinstance(value, (str, bool, int)):
        raise ValueError(f"{key} is multivalued: use ForAllValues or ForAnyValue with {operator}")
    return one(_text(value))


def _listed_value(value: Value) -> list[Value]:
    return [value] if isinstance(value, (str, bool, int)) else list(value)


def _text(value: Value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- the stack's documents, rendered --------------------------------------------------------------


def render(node: Any, names: Mapping[str, str], conditions: Mapping[str, bool] | None = None) -> Any:
    """`node` of a CloudFormation template (as `infra.stack.load_template` parses it) with its
    intrinsic functions resolved: `Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::If`. `names` maps what a
    `Ref` or `${...}` names ("AWS::Region", "Bucket", "Bucket.Arn", "SecretPrefix", ...) to its
    value in the stack; `conditions` the template's conditions (CloudFormation User Guide,
    "Intrinsic function reference")."""
    conditions = conditions or {}
    if isinstance(node, list):
        return [render(n, names, conditions) for n in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Ref"}:
        return _named(names, node["Ref"])
    if set(node) == {"Fn::GetAtt"}:
        return _named(names, ".".join(node["Fn::GetAtt"]))
    if set(node) == {"Fn::Sub"}:
        return re.sub(r"\$\{([^}!*?$]+)\}", lambda m: _named(names, m.group(1)), node["Fn::Sub"])
    if set(node) == {"Fn::If"}:
        condition, then, otherwise = node["Fn::If"]
        return render(then if conditions[condition] else otherwise, names, conditions)
    return {k: render(v, names, conditions) for k, v in node.items()}


def _named(names: Mapping[str, str], name: str) -> str:
    """A resource the caller did not name (one a later template adds) stands in as `<name>`."""
    if name.startswith("AWS::"):
        return names[name]
    return names.get(name, f"<{name}>")
