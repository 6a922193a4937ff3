"""infra.aws and infra.resources against fake credentials, botocore stubs and moto."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from botocore import exceptions as bx
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber

from distrain_cloud.infra import aws, resources
from distrain_cloud.infra.errors import UserError

ACCOUNT = "123456789012"  # moto's default account


def _trust(*services: str) -> str:
    principal = {"Service": list(services) if len(services) > 1 else services[0]}
    statement = {"Effect": "Allow", "Principal": principal, "Action": "sts:AssumeRole"}
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def _translated(code: str, message: str = "", status: int = 400, meta: dict | None = None) -> str:
    """The UserError text translate_errors gives for a stubbed GetCallerIdentity error."""
    sts = aws.client("sts", "us-east-1")
    with Stubber(sts) as stub:
        stub.add_client_error("get_caller_identity", code, message, status, response_meta=meta)
        with pytest.raises(UserError) as info, aws.translate_errors():
            sts.get_caller_identity()
    text = str(info.value)
    assert "\n" not in text
    return text


# --- clients ---------------------------------------------------------------------------


def test_import_is_lazy():
    code = "import sys, distrain_cloud.infra.aws, distrain_cloud.infra.resources; print('boto' in str([*sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_client_config(aws_credentials):
    client = aws.client("s3", "eu-west-1")
    # botocore counts retries: max_attempts=8 -> total_max_attempts=9 (the first call + 8 retries)
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": aws.MAX_ATTEMPTS + 1}
    assert client.meta.config.user_agent_extra == "distrain-cloud/0.1"
    assert client.meta.region_name == "eu-west-1"
    assert aws.client("s3") is not aws.client("s3")  # a new client per call


def test_client_uses_aws_region_and_endpoint_url(aws_credentials, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
    sts = aws.client("sts")
    assert sts.meta.region_name == "eu-central-1"
    assert sts.meta.endpoint_url == "http://127.0.0.1:4566"  # botocore honours it natively


# --- region ----------------------------------------------------------------------------


def test_region_precedence(aws_credentials, monkeypatch, tmp_path):
    assert aws.region("eu-west-1") == "eu-west-1"
    assert aws.region(None) == "us-east-1"  # AWS_DEFAULT_REGION from the fixture
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert aws.region(None) == "us-west-2"
    assert aws.region("ap-southeast-2") == "ap-southeast-2"
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    config = tmp_path / "config"
    config.write_text("[profile work]\nregion = eu-north-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "work")
    assert aws.region(None) == "eu-north-1"


def test_region_missing(aws_credentials, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(UserError, match="no AWS region: pass --region or set AWS_REGION"):
        aws.region(None)


@pytest.mark.parametrize("bad, hint", [("us-est-1", "us-east-1"), ("euwest1", "eu-west-1"), ("mars-1", "")])
def test_region_unknown(aws_credentials, bad, hint):
    with pytest.raises(UserError, match=f"unknown AWS region '{bad}'") as info:
        aws.region(bad)
    assert hint in str(info.value)


def test_region_known_in_other_partitions(aws_credentials):
    assert aws.region("us-gov-west-1") == "us-gov-west-1"
    assert aws.region("cn-north-1") == "cn-north-1"


# --- translate_errors ------------------------------------------------------------------


@pytest.mark.parametrize("missing", [("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), ("AWS_SECRET_ACCESS_KEY",)])
def test_no_or_partial_credentials(aws_credentials, monkeypatch, missing):
    # Only the secret missing -> PartialCredentialsError; both -> NoCredentialsError.
    for name in (*missing, "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match=r"no AWS credentials found: run `aws configure` or set AWS_PROFILE") as info:
        aws.account_id("us-east-1")
    assert isinstance(info.value.__cause__, (bx.NoCredentialsError, bx.PartialCredentialsError))


@pytest.mark.parametrize("code", ["AccessDenied", "AccessDeniedException", "UnauthorizedOperation"])
def test_access_denied_names_operation_and_permission(aws_credentials, code):
    message = (
        f"User: arn:aws:iam::{ACCOUNT}:user/alice is not authorized to perform: sts:GetCallerIdentity "
        "because no identity-based policy allows the sts:GetCallerIdentity action"
    )
    text = _translated(code, message, 403)
    assert "AWS denied GetCallerIdentity" in text and "missing permission sts:GetCallerIdentity" in text


def test_access_denied_without_permission_in_message(aws_credentials):
    message = "You are not authorized.\nEncoded authorization failure message: abc123"
    text = _translated("UnauthorizedOperation", message, 403)
    assert "AWS denied GetCallerIdentity" in text and "missing permission" not in text and "abc123" not in text


def test_quota(aws_credentials):
    message = ("The account-level service limit 'ml.p4d.24xlarge for training job usage' is 0 Instances. "
               "Please use AWS Service Quotas to request an increase for this quota.")  # fmt: skip
    text = _translated("ResourceLimitExceeded", message)
    assert "quota exceeded" in text and "ml.p4d.24xlarge for training job usage" in text
    assert "Service Quotas" in text and "request-service-quota-increase" in text


@pytest.mark.parametrize("code", ["ThrottlingException", "Throttling", "RequestLimitExceeded"])
def test_throttling(aws_credentials, code):
    text = _translated(code, "Rate exceeded", meta={"RetryAttempts": 8})
    assert text == "AWS is throttling GetCallerIdentity (gave up after 9 attempts); retry later"


def test_throttling_is_retried_before_translation(aws_credentials, monkeypatch):
    """Real retry path: every send is throttled; standard mode retries, then we translate."""
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    body = (b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message>"
            b"</Error><RequestId>r</RequestId></ErrorResponse>")  # fmt: skip

    class Raw:
        def stream(self, **_):
            yield body

    sends = []

    def throttled(request, **_):
        sends.append(request)
        return AWSResponse(request.url, 400, {}, Raw())

    sts = aws.client("sts", "us-east-1")
    sts.meta.events.register_first("before-send.sts.GetCallerIdentity", throttled)
    with pytest.raises(UserError, match="AWS is throttling GetCallerIdentity .*retry later"), aws.translate_errors():
        sts.get_caller_identity()
    assert len(sends) == aws.MAX_ATTEMPTS + 1


def test_validation_is_one_line(aws_credentials):
    text = _translated("ValidationException", "1 validation error detected:\n  Value 'x' at 'roleArn' failed")
    assert text == "AWS rejected GetCallerIdentity: 1 validation error detected: Value 'x' at 'roleArn' failed"


@pytest.mark.parametrize("code", ["ExpiredToken", "ExpiredTokenException"])
def test_expired_token(aws_credentials, code):
    assert "AWS credentials have expired" in _translated(code, "The security token in the request is expired", 403)


def test_other_client_errors_stay_one_line(aws_credentials):
    assert _translated("SomethingOdd", "odd\nthing") == "AWS GetCallerIdentity failed (SomethingOdd): odd thing"


def test_endpoint_connection_error(aws_credentials, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(UserError, match=r"cannot reach AWS endpoint http://127.0.0.1:9/?: check the region / network"):
        aws.account_id("us-east-1")


def test_request_parameters_are_not_echoed(aws_credentials):
    s3 = aws.client("s3", "us-east-1")
    with Stubber(s3) as stub:
        stub.add_client_error("put_object", "AccessDenied", "Access Denied", 403)
        with pytest.raises(UserError) as info, aws.translate_errors():
            s3.put_object(Bucket="bkt", Key="k", Body=b"hunter2-secret", SSECustomerKey="sekrit-key")
    assert "hunter2" not in str(info.value) and "sekrit" not in str(info.value)
    assert str(info.value) == "AWS denied PutObject: grant it to your IAM user/role and retry"


def test_non_aws_errors_pass_through(aws_credentials):
    with pytest.raises(KeyError), aws.translate_errors():
        raise KeyError("x")


# --- resources under moto --------------------------------------------------------------


def test_account_id(mocked_aws):
    assert aws.account_id() == ACCOUNT
    assert resources.default_bucket(aws.account_id(), "eu-west-1") == f"distrain-cloud-{ACCOUNT}-eu-west-1"


@pytest.mark.parametrize("region, location", [("us-east-1", None), ("eu-west-1", "eu-west-1")])
def test_ensure_bucket_idempotent_and_region_correct(mocked_aws, region, location):
    name = f"distrain-cloud-test-{region}"
    assert resources.ensure_bucket(name, region) == name
    assert resources.ensure_bucket(name, region) == name
    s3 = aws.client("s3", region)
    assert s3.get_bucket_location(Bucket=name).get("LocationConstraint") == location
    block = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert all(block.values()) and len(block) == 4
    rules = s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"


def test_ensure_bucket_in_wrong_region(mocked_aws):
    resources.ensure_bucket("distrain-cloud-elsewhere", "eu-west-1")
    with pytest.raises(UserError, match="'distrain-cloud-elsewhere' is in eu-west-1, not us-west-2"):
        resources.ensure_bucket("distrain-cloud-elsewhere", "us-west-2")


def test_ensure_bucket_owned_by_someone_else(stub_client):
    stub_client("s3").add_client_error("head_bucket", "403", "Forbidden", 403)
    with pytest.raises(UserError, match="'taken-bucket' exists but belongs to another account"):
        resources.ensure_bucket("taken-bucket", "us-east-1")


def test_ensure_bucket_name_taken_on_create(stub_client):
    stub = stub_client("s3")
    stub.add_client_error("head_bucket", "404", "Not Found", 404)
    stub.add_client_error("create_bucket", "BucketAlreadyExists", "The bucket name is not available", 409)
    with pytest.raises(UserError, match="'taken-bucket' is taken by another account"):
        resources.ensure_bucket("taken-bucket", "us-east-1")


def test_check_role(mocked_aws):
    iam = aws.client("iam")
    arn = iam.create_role(RoleName="sm", AssumeRolePolicyDocument=_trust("sagemaker.amazonaws.com"))["Role"]["Arn"]
    assert resources.check_role("sm") == arn
    assert resources.check_role(arn) == arn
    iam.create_role(RoleName="both", Path="/service-role/",
                           AssumeRolePolicyDocument=_trust("ec2.amazonaws.com", "sagemaker.amazonaws.com"))  # fmt: skip
    assert resources.check_role("both") == f"arn:aws:iam::{ACCOUNT}:role/service-role/both"
    assert resources.check_role("both", service_principal="ec2.amazonaws.com").endswith("/both")


def test_check_role_untrusted_missing_or_foreign(mocked_aws):
    aws.client("iam").create_role(RoleName="ec2-only", AssumeRolePolicyDocument=_trust("ec2.amazonaws.com"))
    with pytest.raises(UserError, match="'ec2-only' does not trust sagemaker.amazonaws.com"):
        resources.check_role("ec2-only")
    with pytest.raises(UserError, match="IAM role 'nope' not found"):
        resources.check_role("nope")
    with pytest.raises(UserError, match="is not in this account"):
        resources.check_role("arn:aws:iam::999999999999:role/ec2-only")


def test_upload_if_absent_uploads_once(mocked_aws):
    resources.ensure_bucket("distrain-cloud-code", "us-east-1")
    key = "p/code/abc.tar.gz"
    assert resources.upload_if_absent("distrain-cloud-code", key, b"first") is True
    assert resources.upload_if_absent("distrain-cloud-code", key, b"second") is False
    body = aws.client("s3").get_object(Bucket="distrain-cloud-code", Key=key)["Body"].read()
    assert body == b"first"


@pytest.mark.parametrize(
    "code, exit_code",
    [
        ("AccessDenied", 4),
        ("UnauthorizedOperation", 4),
        ("ExpiredToken", 3),
        ("InvalidClientTokenId", 3),
        ("VcpuLimitExceeded", 5),
        ("InsufficientInstanceCapacity", 5),
        ("Throttling", 5),
        ("ValidationError", 2),
    ],
)
def test_errors_exit_with_their_class_code(aws_credentials, code, exit_code):
    sts = aws.client("sts", "us-east-1")
    with Stubber(sts) as stub:
        stub.add_client_error("get_caller_identity", code, "x", 400)
        with pytest.raises(UserError) as info, aws.translate_errors():
            sts.get_caller_identity()
    assert info.value.exit_code == exit_code


def test_no_credentials_exits_3(no_aws_config):
    with pytest.raises(UserError, match="no AWS credentials found") as info, aws.translate_errors():
        aws.client("sts", "us-east-1").get_caller_identity()
    assert info.value.exit_code == 3


def test_a_missing_profile_is_one_line_through_the_cli(no_aws_config, monkeypatch, capsys):
    """AWS_PROFILE naming no profile: botocore raises ProfileNotFound while looking up the region,
    before any client exists. The dry run (a pure plan) says so in its region check; a real
    submit refuses in one line instead of a traceback."""
    from clirun import run_cli

    monkeypatch.setenv("AWS_PROFILE", "nope")
    code, out, err = run_cli(capsys, "submit", "--instance", "ml.p3.2xlarge", "--dry-run")
    assert code == 0, out + err
    assert "[skip] region: AWS profile 'nope' not found" in out
    code, out, err = run_cli(capsys, "submit", "--instance", "ml.p3.2xlarge", "--max-run", "1h")
    assert code == 2, out + err
    assert "AWS profile 'nope' not found" in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err
    assert aws.configured()[0] is None
