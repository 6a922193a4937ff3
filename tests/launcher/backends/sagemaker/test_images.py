import functools
import json
import shlex
from pathlib import Path

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher.backends.sagemaker import images
from distrain_cloud.launcher.backends.sagemaker.images import (
    choose_training_image,
    cuda_incompatibility,
    parse_cuda_version,
    training_images,
)
from distrain_cloud.launcher.catalog import PRICE_REGIONS, all_instances, lookup

ACCOUNT = "111122223333"
REPO = Path(__file__).resolve().parents[4]


def fake_config(*entries, processors=("gpu",)):
    """A huggingface.json shaped config: entries are (transformers, pytorch, {processor: container}, regions)."""
    versions = {}
    for tv, pt, containers, regions in entries:
        versions.setdefault(tv, {})[f"pytorch{pt}"] = {
            "py_versions": ["py312"],
            "repository": "huggingface-pytorch-training",
            "container_version": containers,
            "registries": {r: ACCOUNT for r in regions},
        }
    return {"training": {"processors": list(processors), "versions": versions}}


REGIONS = ("us-east-1", "us-west-2", "eu-west-1")
FAKE = fake_config(
    ("6.0.0", "2.11.0", {"gpu": "cu140-ubuntu24.04"}, REGIONS),  # a future CUDA major
    ("5.3.0", "2.9.0", {"gpu": "cu130-ubuntu22.04"}, REGIONS),
    ("4.56.2", "2.8.0", {"gpu": "cu128-ubuntu22.04"}, REGIONS),
    ("4.26.0", "1.13.1", {"gpu": "cu117-ubuntu20.04"}, REGIONS + ("eu-central-2",)),
)


@pytest.fixture(scope="module")
def shipped():
    """The images of the default config: sagemaker-core's huggingface.json, or the shipped snapshot."""
    return training_images()


@pytest.fixture
def sdk_config():
    """sagemaker-core's own huggingface.json (skips where sagemaker-core is not installed)."""
    path = images.image_config_path()
    if path is None:
        pytest.skip("sagemaker-core is not installed")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture
def no_sdk(monkeypatch):
    """As after the quick-start install: sagemaker-core's image config is nowhere to be found."""
    monkeypatch.setattr(images, "image_config_path", lambda: None)
    images.default_image_config.cache_clear()
    yield
    images.default_image_config.cache_clear()


# --- the CUDA rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cu130-ubuntu22.04", (13, 0)),
        ("cu124-ubuntu22.04", (12, 4)),
        ("cu110-ubuntu18.04", (11, 0)),
        ("2.9.0-transformers5.3.0-gpu-py312-cu130-ubuntu22.04", (13, 0)),
        (
            "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:2.1.0-transformers4.36.0-gpu-py310-cu121-ubuntu20.04",
            (12, 1),
        ),
        ("registry.local:5000/team/train:torch2.5-cu92", (9, 2)),
        ("myrepo/train:latest", None),
        ("myrepo/cu130-train:latest", None),  # only the tag counts
        ("myrepo/train@sha256:" + "a" * 64, None),
        ("ubuntu22.04", None),
        ("docu121ment", None),
    ],
)
def test_parse_cuda_version(text, expected):
    assert parse_cuda_version(text) == expected


def test_compute_capability_floor_per_cuda_major():
    v100, t4, a10g, h100 = (lookup(n) for n in ("ml.p3.2xlarge", "ml.g4dn.xlarge", "ml.g5.xlarge", "ml.p5.48xlarge"))
    assert cuda_incompatibility((13, 0), v100) == "V100, compute capability 7.0, needs >= 7.5"
    assert cuda_incompatibility((14, 0), v100) is not None  # newer majors drop at least as much
    assert cuda_incompatibility((12, 9), v100) is None
    assert cuda_incompatibility((13, 0), t4) is None
    assert cuda_incompatibility((13, 0), a10g) is None
    # The other way round: a CUDA older than the architecture has no kernels for it.
    assert cuda_incompatibility((11, 7), h100) == "H100, compute capability 9.0, needs CUDA >= 11.8"
    assert cuda_incompatibility((11, 8), h100) is None
    assert cuda_incompatibility((11, 0), a10g) is not None
    assert cuda_incompatibility((13, 0), lookup("ml.m5.xlarge")) is None


# --- defaults -----------------------------------------------------------------------------


@pytest.mark.parametrize("instance", [i for i in all_instances() if i.gpu_model == "V100"], ids=lambda i: i.name)
@pytest.mark.parametrize("region", PRICE_REGIONS)
def test_v100_never_gets_a_cuda13_image(shipped, instance, region):
    choice = choose_training_image(instance, region)
    assert int(choice.cuda_version.split(".")[0]) < 13
    assert "-cu13" not in choice.uri
    # Newest that runs: every newer image of the config is a CUDA 13 build.
    newer = [
        i
        for i in shipped
        if images._version_key(i.transformers_version) > images._version_key(choice.transformers_version)
    ]
    assert all(i.cuda[0] >= 13 for i in newer)
    assert "V100" in choice.reason


def test_v100_with_any_pin_never_gets_a_cuda13_image(shipped):
    p3 = lookup("ml.p3.8xlarge")
    for image in shipped:
        try:
            choice = choose_training_image(
                p3, "us-east-1", transformers_version=image.transformers_version, pytorch_version=image.pytorch_version
            )
        except UserError as err:
            assert image.cuda[0] >= 13 and "sagemaker.transformers_version" in str(err)
        else:
            assert int(choice.cuda_version.split(".")[0]) < 13


@pytest.mark.parametrize(
    "name",
    [
        "ml.p4d.24xlarge",
        "ml.p5.48xlarge",
        "ml.g5.12xlarge",
        "p4d.24xlarge",
        "g5.xlarge",
        "ml.g6e.48xlarge",
        "ml.g4dn.12xlarge",
    ],
)
def test_modern_gpus_get_the_newest_image(shipped, name):
    newest = shipped[0]
    choice = choose_training_image(lookup(name), "us-east-1")
    assert choice.uri == newest.uri("us-east-1")
    assert (choice.transformers_version, choice.pytorch_version, choice.py_version, choice.cuda_version) == (
        newest.transformers_version,
        newest.pytorch_version,
        newest.py_version,
        newest.cuda_version,
    )
    assert choice.reason.startswith("newest image")


def test_fake_config_rule():
    p3, t4, h100 = lookup("ml.p3.16xlarge"), lookup("ml.g4dn.xlarge"), lookup("ml.p5.48xlarge")
    assert choose_training_image(p3, "us-west-2", config=FAKE).cuda_version == "12.8"
    assert choose_training_image(t4, "us-west-2", config=FAKE).cuda_version == "14.0"
    chosen = choose_training_image(h100, "us-west-2", config=FAKE)
    assert chosen.uri == (
        f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/huggingface-pytorch-training:"
        "2.11.0-transformers6.0.0-gpu-py312-cu140-ubuntu24.04"
    )
    assert (chosen.transformers_version, chosen.pytorch_version, chosen.py_version) == ("6.0.0", "2.11.0", "py312")


def test_only_cuda13_images_and_a_v100_is_a_clear_error():
    cfg = fake_config(("5.3.0", "2.9.0", {"gpu": "cu130-ubuntu22.04"}, REGIONS))
    with pytest.raises(UserError) as err:
        choose_training_image(lookup("ml.p3.2xlarge"), "us-east-1", config=cfg)
    msg = str(err.value)
    assert "runs on ml.p3.2xlarge" in msg and "needs >= 7.5" in msg and "--image-uri" in msg and "cu12x" in msg


# --- pins -----------------------------------------------------------------------------------


def test_pin_by_alias_or_full_version():
    h100 = lookup("ml.p5.48xlarge")
    a = choose_training_image(h100, "us-east-1", transformers_version="4.56", config=FAKE)
    b = choose_training_image(h100, "us-east-1", transformers_version="4.56.2", pytorch_version="2.8", config=FAKE)
    assert a == b and a.transformers_version == "4.56.2" and a.pytorch_version == "2.8.0"
    assert "pinned" in a.reason


def test_pinned_cuda13_on_v100_is_refused_with_the_fix():
    with pytest.raises(UserError) as err:
        choose_training_image(lookup("ml.p3.8xlarge"), "us-east-1", transformers_version="5.3", config=FAKE)
    msg = str(err.value)
    assert "CUDA 13.0 build, which cannot run on ml.p3.8xlarge (V100, compute capability 7.0, needs >= 7.5)" in msg
    assert "drop sagemaker.transformers_version" in msg and "-cu128-" in msg


def test_pinned_old_cuda_on_hopper_is_refused():
    with pytest.raises(UserError, match=r"CUDA 11.7 build, which cannot run on ml.p5.48xlarge .*needs CUDA >= 11.8"):
        choose_training_image(lookup("ml.p5.48xlarge"), "us-east-1", transformers_version="4.26", config=FAKE)


def test_pin_matching_nothing_lists_the_pairs():
    with pytest.raises(UserError, match=r"sagemaker\.transformers_version: 9\.9.*5\.3\.0/2\.9\.0"):
        choose_training_image(lookup("ml.g5.xlarge"), "us-east-1", transformers_version="9.9", config=FAKE)


# --- explicit images -----------------------------------------------------------------------

CU130 = (
    "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:"
    "2.9.0-transformers5.3.0-gpu-py312-cu130-ubuntu22.04"
)


def test_explicit_cuda13_image_on_v100_is_refused():
    with pytest.raises(UserError) as err:
        choose_training_image(lookup("ml.p3.8xlarge"), "us-east-1", image_uri=CU130, config=FAKE)
    msg = str(err.value)
    assert msg.startswith(
        "image huggingface-pytorch-training:2.9.0-transformers5.3.0-gpu-py312-cu130-ubuntu22.04 "
        "is a CUDA 13.0 build, which cannot run on ml.p3.8xlarge "
        "(V100, compute capability 7.0, needs >= 7.5)"
    )
    default = choose_training_image(lookup("ml.p3.8xlarge"), "us-east-1", config=FAKE)
    assert f"drop --image-uri to let distrain-cloud pick {default.uri}, or choose a cu12x image" in msg
    assert "\n" not in msg


def test_explicit_cuda13_image_on_v100_with_the_shipped_config(shipped):
    with pytest.raises(
        UserError,
        match=r"cannot run on p3\.2xlarge .*drop --image-uri to let distrain-cloud pick "
        r"\S+-cu12\d-\S+, or choose a cu12x image",
    ):
        choose_training_image(lookup("p3.2xlarge"), "us-east-1", image_uri=CU130)


def test_explicit_compatible_image_is_described():
    choice = choose_training_image(lookup("ml.p4d.24xlarge"), "us-east-1", image_uri=CU130, config=FAKE)
    assert choice == images.ImageChoice(
        CU130, "5.3.0", "2.9.0", "py312", "13.0", "explicit image, CUDA 13.0 runs on A100"
    )


@pytest.mark.parametrize(
    "uri",
    [
        "myrepo/train:latest",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/mine",
        "ghcr.io/acme/train@sha256:" + "0" * 64,
    ],
)
def test_explicit_image_with_unknown_cuda_is_accepted(uri):
    choice = choose_training_image(lookup("ml.p3.2xlarge"), "us-east-1", image_uri=uri, config=FAKE)
    assert choice.uri == uri and choice.cuda_version is None
    assert choice.reason == "explicit image, CUDA version unknown"


def test_explicit_image_contradicting_a_pin_is_refused():
    with pytest.raises(
        UserError,
        match=r"--image-uri is a transformers 5\.3\.0 image but sagemaker\.transformers_version asks for "
        r"4\.56",
    ):
        choose_training_image(lookup("ml.p4d.24xlarge"), "us-east-1", image_uri=CU130, transformers_version="4.56")


# --- regions and CPU --------------------------------------------------------------------------


def test_unknown_region_is_named_with_the_known_ones():
    with pytest.raises(UserError) as err:
        choose_training_image(lookup("ml.g5.xlarge"), "us-eats-1", config=FAKE)
    msg = str(err.value)
    assert "unknown region 'us-eats-1' (--region)" in msg and "us-east-1" in msg and "eu-west-1" in msg


def test_unknown_region_with_the_shipped_config(shipped):
    with pytest.raises(UserError, match=r"unknown region 'mars-north-1'.*us-west-2"):
        choose_training_image(lookup("ml.g5.xlarge"), "mars-north-1")


def test_region_lagging_behind_is_not_a_silent_downgrade():
    with pytest.raises(UserError, match=r"not published in eu-central-2.*sagemaker\.transformers_version: '4\.26\.0'"):
        choose_training_image(lookup("ml.g5.xlarge"), "eu-central-2", config=FAKE)
    pinned = choose_training_image(lookup("ml.g5.xlarge"), "eu-central-2", transformers_version="4.26", config=FAKE)
    assert pinned.uri.startswith(f"{ACCOUNT}.dkr.ecr.eu-central-2.amazonaws.com/")


def test_partition_hostnames(shipped):
    choice = choose_training_image(lookup("ml.p4d.24xlarge"), "cn-north-1")
    assert ".dkr.ecr.cn-north-1.amazonaws.com.cn/" in choice.uri


def test_cpu_instance_without_cpu_images_is_a_clear_error():
    with pytest.raises(UserError, match=r"ml\.m5\.xlarge has no GPU.*--instance, e\.g\..*--image-uri"):
        choose_training_image(lookup("ml.m5.xlarge"), "us-east-1", config=FAKE)


def test_cpu_instance_gets_a_cpu_image_when_the_config_has_one():
    cfg = fake_config(
        ("5.3.0", "2.9.0", {"gpu": "cu130-ubuntu22.04", "cpu": "ubuntu22.04"}, REGIONS), processors=("cpu", "gpu")
    )
    choice = choose_training_image(lookup("c5.2xlarge"), "us-east-1", config=cfg)
    assert choice.cuda_version is None and choice.uri.endswith(":2.9.0-transformers5.3.0-cpu-py312-ubuntu22.04")
    assert choose_training_image(lookup("g5.xlarge"), "us-east-1", config=cfg).cuda_version == "13.0"


# --- agreement with sagemaker-core ------------------------------------------------------------


@pytest.mark.slow  # imports sagemaker-core and resolves every shipped image: over 3 s in CI's gate, twice
def test_uris_equal_sagemaker_core_retrieve(shipped, monkeypatch):
    image_uris = pytest.importorskip("sagemaker.core.image_uris")
    # retrieve() re-reads botocore's endpoint data on every call (~40 ms); read it once.
    monkeypatch.setattr(
        image_uris.utils, "_botocore_resolver", functools.lru_cache()(image_uris.utils._botocore_resolver)
    )

    def retrieve(image, region, instance_type="ml.p4d.24xlarge"):
        return image_uris.retrieve(
            framework="huggingface",
            region=region,
            version=image.transformers_version,
            base_framework_version=f"pytorch{image.pytorch_version}",
            py_version=image.py_version,
            instance_type=instance_type,
            image_scope="training",
        )

    for image in shipped:
        for region in ("us-east-1", "us-west-2", "eu-west-1"):
            assert image.uri(region) == retrieve(image, region)
    for region in shipped[0].registries:  # every partition's hostname, newest image
        assert shipped[0].uri(region) == retrieve(shipped[0], region)
    for name in ("ml.p3.8xlarge", "ml.g5.12xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge"):
        choice = choose_training_image(lookup(name), "us-east-1")
        assert choice.uri == image_uris.retrieve(
            framework="huggingface",
            region="us-east-1",
            version=choice.transformers_version,
            base_framework_version=f"pytorch{choice.pytorch_version}",
            py_version=choice.py_version,
            instance_type=name,
            image_scope="training",
        )


# --- the shipped snapshot ------------------------------------------------------------------


def snapshot():
    with open(images.SNAPSHOT_PATH, encoding="utf-8") as f:
        return json.load(f)


def test_the_snapshot_agrees_with_sagemaker_core_for_every_entry_it_keeps(sdk_config):
    snap = snapshot()
    assert snap["source"].startswith("sagemaker-core ") and snap["file"].endswith("image_uri_config/huggingface.json")
    sdk = sdk_config["training"]
    stale = [
        f"{tv}/{framework}"
        for tv, by_framework in snap["training"]["versions"].items()
        for framework, entry in by_framework.items()
        if entry != {key: sdk["versions"].get(tv, {}).get(framework, {}).get(key) for key in entry}
    ]
    assert stale == [], f"refresh the snapshot: {snap['refresh']}"
    assert snap["training"]["processors"] == sdk["processors"]
    assert set(training_images(snap)) <= set(training_images(sdk_config))


def test_the_snapshot_keeps_only_entries_that_make_images():
    snap = snapshot()
    kept = {(tv, fw) for tv, by_framework in snap["training"]["versions"].items() for fw in by_framework}
    assert kept == {(i.transformers_version, f"pytorch{i.pytorch_version}") for i in training_images(snap)}
    assert len(kept) >= 10


def test_the_installed_sdk_is_preferred_over_the_snapshot(sdk_config):
    images.default_image_config.cache_clear()
    assert images.default_image_config().config == sdk_config
    assert images.image_config_source().endswith("(installed)")


def test_without_the_sdk_the_snapshot_is_used_and_named(no_sdk):
    assert images.image_config_source() == f"{snapshot()['source']} (snapshot shipped with distrain-cloud)"
    choice = choose_training_image(lookup("ml.p4d.24xlarge"), "us-east-1")
    assert choice.cuda_version is not None and choice.reason.endswith(
        f"; image list: {snapshot()['source']} (snapshot shipped with distrain-cloud)"
    )


def test_refresh_rewrites_the_snapshot_from_the_sdk(sdk_config, tmp_path):
    out = tmp_path / "huggingface_images.json"
    source = images.refresh_snapshot(str(out))
    written = json.loads(out.read_text())
    assert written["source"] == source and training_images(written) == training_images(sdk_config)


def test_refresh_without_the_sdk_names_the_extra(no_sdk, tmp_path):
    with pytest.raises(UserError, match=r"distrain-cloud\[sagemaker\]"):
        images.refresh_snapshot(str(tmp_path / "x.json"))


def test_the_readme_sagemaker_dry_run_works_without_the_sdk(no_sdk, no_aws_config, monkeypatch, capsys):
    """README's SageMaker dry-run, after the quick-start install (no [sagemaker] extra)."""
    import botocore.client

    from distrain_cloud.launcher import cli

    def refuse(self, operation_name, api_params):
        raise AssertionError(f"a dry run called AWS: {operation_name}")

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", refuse)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("distrain-cloud submit examples/sagemaker-"))
    argv = shlex.split(line, comments=True)
    assert argv[0] == "distrain-cloud" and "--dry-run" in argv
    monkeypatch.chdir(REPO)
    cli._TRAIN_ARGS.clear()
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv[1:])
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out
    uri = choose_training_image(lookup("ml.p3.8xlarge"), "us-east-1").uri
    assert f"image: {uri}\n" in out and "snapshot shipped with distrain-cloud" in out
