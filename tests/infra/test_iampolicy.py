"""The test evaluator (tests/iampolicy.py) decides as the IAM User Guide says, on small documents.

Each case is one rule of "Policy evaluation logic", "Permissions boundaries for IAM entities" or
"IAM JSON policy elements: Condition operators", and each has its counterpart that must go the
other way, so a rule the evaluator dropped fails here rather than passing a policy test.
"""

from __future__ import annotations

import pytest
from iampolicy import (
    ALLOW,
    EXPLICIT_DENY,
    IMPLICIT_DENY,
    Request,
    decide,
    render,
    trusts,
)  # tests/ is on pytest's pythonpath


def policy(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def allow(action, resource, **condition) -> dict:
    return {
        "Effect": "Allow",
        "Action": action,
        "Resource": resource,
        **({"Condition": condition} if condition else {}),
    }


BUCKET = "arn:aws:s3:::b"


def test_explicit_deny_wins_and_a_boundary_caps_the_identity_policy():
    get = Request("s3:GetObject", f"{BUCKET}/jobs/a/x")
    mine = policy(allow("s3:GetObject", f"{BUCKET}/jobs/a/*"))
    assert decide(get, [mine]) == ALLOW
    assert decide(get, []) == IMPLICIT_DENY
    # An Allow is needed in the boundary too: the intersection.
    assert decide(get, [mine], policy(allow("s3:PutObject", f"{BUCKET}/*"))) == IMPLICIT_DENY
    assert decide(get, [mine], policy(allow("s3:*", f"{BUCKET}/*"))) == ALLOW
    # A boundary grants nothing by itself.
    assert decide(get, [], policy(allow("s3:*", "*"))) == IMPLICIT_DENY
    # An explicit Deny anywhere, the boundary included, wins over every Allow.
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": f"{BUCKET}/jobs/a/*"}
    assert decide(get, [mine, policy(deny)]) == EXPLICIT_DENY
    assert decide(get, [mine], policy(allow("s3:*", "*"), deny)) == EXPLICIT_DENY


def test_actions_ignore_case_and_resources_match_per_arn_part():
    statement = policy(allow("S3:get*", "arn:aws:s3:::b/jobs/a/*"))
    assert decide(Request("s3:GetObject", f"{BUCKET}/jobs/a/deep/x"), [statement]) == ALLOW
    assert decide(Request("s3:GetObject", f"{BUCKET}/jobs/ab/x"), [statement]) == IMPLICIT_DENY
    assert decide(Request("s3:GetObject", "arn:aws:s3:::B/jobs/a/x"), [statement]) == IMPLICIT_DENY  # case
    # A wildcard in the region or account part does not swallow a colon.
    logs = policy(allow("logs:PutLogEvents", "arn:aws:logs:*:1:log-group:g:log-stream:a/*"))
    assert decide(Request("logs:PutLogEvents", "arn:aws:logs:us-east-1:1:log-group:g:log-stream:a/n"), [logs]) == ALLOW
    assert decide(Request("logs:PutLogEvents", "arn:aws:logs:us:east:1:log-group:g:log-stream:a/n"), [logs]) == (
        IMPLICIT_DENY
    )
    # ? is one character; NotAction and NotResource invert.
    secret = policy(allow("secretsmanager:GetSecretValue", "arn:aws:secretsmanager:r:1:secret:hf-??????"))
    assert decide(Request("secretsmanager:GetSecretValue", "arn:aws:secretsmanager:r:1:secret:hf-AbCdEf"), [secret])
    assert decide(
        Request("secretsmanager:GetSecretValue", "arn:aws:secretsmanager:r:1:secret:hf-x-AbCdEf"), [secret]
    ) == (IMPLICIT_DENY)
    not_iam = policy({"Effect": "Allow", "NotAction": "iam:*", "NotResource": f"{BUCKET}/secret/*"})
    assert decide(Request("s3:GetObject", f"{BUCKET}/open/x"), [not_iam]) == ALLOW
    assert decide(Request("iam:PassRole", "*"), [not_iam]) == IMPLICIT_DENY
    assert decide(Request("s3:GetObject", f"{BUCKET}/secret/x"), [not_iam]) == IMPLICIT_DENY


def test_special_characters_are_literals_and_variables_take_the_requests_value():
    # "IAM policy elements: Variables and tags", "Special characters".
    literal = policy(allow("s3:GetObject", "arn:aws:s3:::b/data/${*}/x"))
    assert decide(Request("s3:GetObject", f"{BUCKET}/data/*/x"), [literal]) == ALLOW
    assert decide(Request("s3:GetObject", f"{BUCKET}/data/other/x"), [literal]) == IMPLICIT_DENY
    own = policy(allow("s3:GetObject", "arn:aws:s3:::b/home/${aws:username}/*"))
    assert decide(Request("s3:GetObject", f"{BUCKET}/home/ann/x", {"aws:username": "ann"}), [own]) == ALLOW
    assert decide(Request("s3:GetObject", f"{BUCKET}/home/bob/x", {"aws:username": "ann"}), [own]) == IMPLICIT_DENY
    assert decide(Request("s3:GetObject", f"{BUCKET}/home/ann/x"), [own]) == IMPLICIT_DENY  # no value: no match


def test_conditions_and_within_or_across_values_and_absent_keys():
    statement = policy(
        allow(
            "ec2:TerminateInstances",
            "*",
            StringEquals={"aws:ResourceTag/stack": "s", "aws:ResourceTag/job": ["a", "a2"]},
        )
    )
    terminate = "ec2:TerminateInstances"
    assert decide(Request(terminate, "i", {"aws:ResourceTag/stack": "s", "aws:ResourceTag/job": "a2"}), [statement])
    assert decide(Request(terminate, "i", {"aws:ResourceTag/stack": "s", "aws:ResourceTag/job": "b"}), [statement]) == (
        IMPLICIT_DENY
    )
    assert decide(Request(terminate, "i", {"aws:ResourceTag/job": "a"}), [statement]) == IMPLICIT_DENY  # no stack tag
    # Key names are case-insensitive; values are not.
    assert decide(Request(terminate, "i", {"AWS:resourcetag/STACK": "s", "aws:ResourceTag/job": "a"}), [statement])
    assert decide(Request(terminate, "i", {"aws:ResourceTag/stack": "S", "aws:ResourceTag/job": "a"}), [statement]) == (
        IMPLICIT_DENY
    )
    # A negated operator holds when the key is absent; ...IfExists too; Null tests presence.
    negated = policy(allow("x:Y", "*", StringNotEquals={"aws:RequestTag/k": "v"}))
    assert decide(Request("x:Y", "*"), [negated]) == ALLOW
    assert decide(Request("x:Y", "*", {"aws:RequestTag/k": "v"}), [negated]) == IMPLICIT_DENY
    if_exists = policy(allow("x:Y", "*", StringEqualsIfExists={"k": "v"}))
    assert decide(Request("x:Y", "*"), [if_exists]) == ALLOW
    assert decide(Request("x:Y", "*", {"k": "w"}), [if_exists]) == IMPLICIT_DENY
    null = policy(allow("x:Y", "*", Null={"autoscaling:MaxSize": "true"}))
    assert decide(Request("x:Y", "*"), [null]) == ALLOW
    assert decide(Request("x:Y", "*", {"autoscaling:MaxSize": "4"}), [null]) == IMPLICIT_DENY
    # Bool compares the text of a boolean.
    tls = policy(allow("s3:GetObject", "*", Bool={"aws:SecureTransport": "true"}))
    assert decide(Request("s3:GetObject", "x", {"aws:SecureTransport": True}), [tls]) == ALLOW
    assert decide(Request("s3:GetObject", "x", {"aws:SecureTransport": False}), [tls]) == IMPLICIT_DENY


def test_string_like_arn_like_and_the_set_operators():
    listing = policy(allow("s3:ListBucket", BUCKET, StringLike={"s3:prefix": ["jobs/a", "jobs/a/*"]}))
    for prefix, expected in (("jobs/a", ALLOW), ("jobs/a/", ALLOW), ("jobs/a/x/", ALLOW), ("jobs/ab", IMPLICIT_DENY)):
        assert decide(Request("s3:ListBucket", BUCKET, {"s3:prefix": prefix}), [listing]) == expected, prefix
    source = policy(allow("x:Y", "*", ArnLike={"aws:SourceArn": "arn:aws:sagemaker:r:1:training-job/*"}))
    assert decide(Request("x:Y", "*", {"aws:SourceArn": "arn:aws:sagemaker:r:1:training-job/j"}), [source]) == ALLOW
    assert decide(Request("x:Y", "*", {"aws:SourceArn": "arn:aws:sagemaker:r:2:training-job/j"}), [source]) == (
        IMPLICIT_DENY
    )
    only_status = policy(allow("ec2:CreateTags", "*", **{"ForAllValues:StringEquals": {"aws:TagKeys": ["status"]}}))
    assert decide(Request("ec2:CreateTags", "i", {"aws:TagKeys": ["status"]}), [only_status]) == ALLOW
    assert decide(Request("ec2:CreateTags", "i", {"aws:TagKeys": ["status", "job"]}), [only_status]) == IMPLICIT_DENY
    assert decide(Request("ec2:CreateTags", "i"), [only_status]) == ALLOW  # ForAllValues: true for no keys
    any_status = policy(allow("ec2:CreateTags", "*", **{"ForAnyValue:StringLike": {"aws:TagKeys": ["stat*"]}}))
    assert decide(Request("ec2:CreateTags", "i", {"aws:TagKeys": ["job", "status"]}), [any_status]) == ALLOW
    assert decide(Request("ec2:CreateTags", "i"), [any_status]) == IMPLICIT_DENY  # ForAnyValue: false for none
    with pytest.raises(ValueError, match="multivalued"):
        decide(
            Request("ec2:CreateTags", "i", {"aws:TagKeys": ["a", "b"]}),
            [policy(allow("*", "*", StringEquals={"aws:TagKeys": "a"}))],
        )


def test_a_trust_policy_admits_only_its_principal_under_its_conditions():
    trust = policy(
        {
            "Effect": "Allow",
            "Principal": {"Service": "sagemaker.amazonaws.com"},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": "1"}},
        }
    )
    role = "arn:aws:iam::1:role/r"
    assert trusts(
        trust, Request("sts:AssumeRole", role, {"aws:SourceAccount": "1"}, {"Service": "sagemaker.amazonaws.com"})
    )
    assert not trusts(
        trust, Request("sts:AssumeRole", role, {"aws:SourceAccount": "2"}, {"Service": "sagemaker.amazonaws.com"})
    )
    assert not trusts(
        trust, Request("sts:AssumeRole", role, {"aws:SourceAccount": "1"}, {"Service": "ec2.amazonaws.com"})
    )


def test_render_resolves_the_templates_intrinsic_functions():
    node = {
        "A": {"Fn::Sub": "arn:${AWS::Partition}:s3:::${Bucket}/${Prefix}/*"},
        "B": {"Fn::GetAtt": ["Bucket", "Arn"]},
        "C": [{"Ref": "AWS::StackName"}, {"Fn::If": ["On", "Allow", "Deny"]}],
    }
    names = {
        "AWS::Partition": "aws",
        "Bucket": "b",
        "Prefix": "p",
        "Bucket.Arn": "arn:aws:s3:::b",
        "AWS::StackName": "s",
    }
    assert render(node, names, {"On": False}) == {
        "A": "arn:aws:s3:::b/p/*",
        "B": "arn:aws:s3:::b",
        "C": ["s", "Deny"],
    }
