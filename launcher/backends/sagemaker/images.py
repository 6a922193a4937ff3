"""Pick the Hugging Face PyTorch training image for an instance and region.

The images and their tags come from sagemaker-core's image config
(sagemaker/core/image_uri_config/huggingface.json), read here as plain JSON: importing
sagemaker.core.image_uris costs a second or more and the launcher stays SDK-free.
Where sagemaker-core is installed its file is read (it is the newest truth); elsewhere a
snapshot of the training images' entries shipped in launcher/data/ stands in, so a plan
needs no SDK. Refresh the snapshot with
`python -m distrain_cloud.launcher.backends.sagemaker.images --refresh-snapshot`. The URI is
built the way `sagemaker.core.image_uris.retrieve(framework="huggingface",
image_scope="training", ...)` builds it;
tests/launcher/backends/sagemaker/test_images.py checks they agree, and that the snapshot matches the SDK.

The one rule this module exists for: never hand out an image whose CUDA build cannot
run on the instance's GPU. Each image's CUDA version is in its tag (cu121, cu124,
cu130, ...). A CUDA major drops old architectures (CUDA 13 needs compute capability
>= 7.5, so no V100 / ml.p3.*), and a CUDA release older than a GPU architecture cannot
target it (Hopper needs CUDA >= 11.8). See docs/catalog.md.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher.catalog import InstanceType

# Oldest GPU architecture (compute capability) each CUDA major still builds for.
# CUDA 11 deprecated Kepler sm_35/37; CUDA 12 removed them (Maxwell sm_50 is its floor);
# CUDA 13 removed Maxwell, Pascal and Volta (Turing sm_75 is its floor).
MIN_COMPUTE_CAPABILITY_BY_CUDA_MAJOR: dict[int, tuple[int, int]] = {
    10: (3, 0),
    11: (3, 5),
    12: (5, 0),
    13: (7, 5),
}

# First CUDA release that can build for a GPU architecture. An image built with an
# older CUDA has no kernels for that GPU.
MIN_CUDA_BY_COMPUTE_CAPABILITY: dict[tuple[int, int], tuple[int, int]] = {
    (7, 0): (9, 0),  # Volta: V100
    (7, 5): (10, 0),  # Turing: T4
    (8, 0): (11, 0),  # Ampere: A100
    (8, 6): (11, 1),  # Ampere: A10G
    (8, 9): (11, 8),  # Ada: L4, L40S
    (9, 0): (11, 8),  # Hopper: H100, H200
    (10, 0): (12, 8),  # Blackwell: B200
}

_CONFIG_RELPATH = ("sagemaker", "core", "image_uri_config", "huggingface.json")
# The training images' entries of that file, for installs without sagemaker-core.
_LAUNCHER = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # launcher/, beside catalog.py
SNAPSHOT_PATH = os.path.join(_LAUNCHER, "data", "huggingface_images.json")
_SNAPSHOT_KEYS = ("processors", "py_versions", "repository", "container_version", "registries")
# The job-spec keys that pin an image (no CLI flag sets them); refusals name them.
TRANSFORMERS_KEY = "sagemaker.transformers_version"
PYTORCH_KEY = "sagemaker.pytorch_version"
_CUDA_IN_TAG = re.compile(r"(?:^|[-_.])cu(\d{2,3})(?=$|[-_.])")
_HF_TAG = re.compile(r"^(?P<pytorch>\d+(?:\.\d+)*)-transformers(?P<transformers>\d+(?:\.\d+)*)")
_PY_IN_TAG = re.compile(r"(?:^|-)(py\d+)(?=$|-)")


@dataclass(frozen=True)
class ImageChoice:
    uri: str
    transformers_version: str | None
    pytorch_version: str | None
    py_version: str | None  # "py312"
    cuda_version: str | None  # "12.4"; None for a CPU image or when unknown
    reason: str  # one short line for plans and logs


@dataclass(frozen=True)
class TrainingImage:
    """One Hugging Face PyTorch training image of the config (before picking a region)."""

    transformers_version: str
    pytorch_version: str
    py_version: str
    processor: str  # "gpu" or "cpu"
    container_version: str  # "cu124-ubuntu22.04"
    cuda_version: str | None  # "12.4"; None for a CPU image
    repository: str  # "huggingface-pytorch-training"
    registries: Mapping[str, str] = field(hash=False, repr=False)  # region -> ECR account

    @property
    def tag(self) -> str:
        parts = (
            f"{self.pytorch_version}-transformers{self.transformers_version}",
            self.processor,
            self.py_version,
            self.container_version,
        )
        return "-".join(p for p in parts if p)

    def uri(self, region: str) -> str:
        return f"{self.registries[region]}.dkr.{ecr_hostname(region)}/{self.repository}:{self.tag}"

    @property
    def cuda(self) -> tuple[int, int] | None:
        return parse_cuda_version(self.container_version) if self.cuda_version else None

    def runs_on(self, instance: InstanceType) -> bool:
        """False when this image's CUDA build cannot run on the instance's GPU."""
        return cuda_incompatibility(self.cuda, instance) is None

    @property
    def label(self) -> str:
        return f"transformers {self.transformers_version} / PyTorch {self.pytorch_version}"


# ---------------------------------------------------------------------------------------
# CUDA versions and what runs where


def parse_cuda_version(tag_or_uri: str) -> tuple[int, int] | None:
    """(12, 4) from a tag or URI holding "cu124"; (11, 0) from "cu110"; None if none."""
    m = _CUDA_IN_TAG.search(_tag_of(tag_or_uri))
    if not m:
        return None
    digits = m.group(1)
    return (int(digits[:-1]), int(digits[-1]))


def cuda_incompatibility(cuda: tuple[int, int] | None, instance: InstanceType) -> str | None:
    """Why a CUDA `cuda` build cannot run on `instance`'s GPU, or None when it can (or
    when either is unknown: a CPU image, a CPU instance).

    The text completes "... is a CUDA 13.0 build, which cannot run on <instance> (<why>)".
    """
    cc = instance.compute_capability
    if cc is None or cuda is None:
        return None
    gpu = f"{instance.gpu_model}, compute capability {cc[0]}.{cc[1]}"
    known_majors = sorted(MIN_COMPUTE_CAPABILITY_BY_CUDA_MAJOR)
    # A CUDA major newer than the table drops at least what the newest known one dropped.
    major = min(cuda[0], known_majors[-1])
    floor = MIN_COMPUTE_CAPABILITY_BY_CUDA_MAJOR.get(major)
    if floor is not None and cc < floor:
        return f"{gpu}, needs >= {floor[0]}.{floor[1]}"
    needs = MIN_CUDA_BY_COMPUTE_CAPABILITY.get(cc)
    if needs is not None and cuda < needs:
        return f"{gpu}, needs CUDA >= {needs[0]}.{needs[1]}"
    return None


def _cuda_advice(instance: InstanceType) -> str:
    """Which images would run: "choose a cu12x image" / "choose a cu118 or newer image"."""
    cc = instance.compute_capability
    assert cc is not None
    majors = [m for m, floor in MIN_COMPUTE_CAPABILITY_BY_CUDA_MAJOR.items() if cc >= floor]
    newest_major = max(majors) if majors else None
    needs = MIN_CUDA_BY_COMPUTE_CAPABILITY.get(cc)
    if newest_major is not None and newest_major < max(MIN_COMPUTE_CAPABILITY_BY_CUDA_MAJOR):
        return f"choose a cu{newest_major}x image"
    if needs is not None:
        return f"choose a cu{needs[0]}{needs[1]} or newer image"
    return "choose an image built for this GPU"


# ---------------------------------------------------------------------------------------
# The config


def ecr_hostname(region: str) -> str:
    """ECR's hostname in `region`, per partition (what botocore's endpoint resolver gives)."""
    if region.startswith("cn-"):
        suffix = "amazonaws.com.cn"
    elif region.startswith("us-isob-"):
        suffix = "sc2s.sgov.gov"
    elif region.startswith("us-isof-"):
        suffix = "csp.hci.ic.gov"
    elif region.startswith("us-iso-"):
        suffix = "c2s.ic.gov"
    elif region.startswith("eu-isoe-"):
        suffix = "cloud.adc-e.uk"
    else:
        suffix = "amazonaws.com"
    return f"ecr.{region}.{suffix}"


def image_config_path() -> str | None:
    """Where sagemaker-core's huggingface.json is, found on sys.path without importing it."""
    for entry in sys.path:
        candidate = os.path.join(entry or os.curdir, *_CONFIG_RELPATH)
        if os.path.isfile(candidate):
            return candidate
    return None


def _sagemaker_core_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("sagemaker-core")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


@dataclass(frozen=True)
class ImageConfig:
    """The parsed huggingface.json (or the snapshot of its training images) and where it came from."""

    config: Mapping[str, Any] = field(repr=False)
    source: str  # "sagemaker-core 2.27.0 (installed)"


@functools.lru_cache(maxsize=1)
def default_image_config() -> ImageConfig:
    """The installed sagemaker-core's image config when there is one, else the shipped snapshot."""
    path = image_config_path()
    if path is not None:
        with open(path, encoding="utf-8") as f:
            return ImageConfig(json.load(f), f"sagemaker-core {_sagemaker_core_version()} (installed)")
    with open(SNAPSHOT_PATH, encoding="utf-8") as f:
        snapshot: dict[str, Any] = json.load(f)
    return ImageConfig(snapshot, f"{snapshot['source']} (snapshot shipped with distrain-cloud)")


def image_config_source() -> str:
    """ "sagemaker-core 2.27.0 (installed)": whose image config is used, for docs and plans."""
    return default_image_config().source


def snapshot_of(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """What the launcher keeps of a huggingface.json: each training image's entry, only the keys
    training_images() reads, under a header naming the sagemaker-core it came from."""
    scope = _training_scope(config)
    used = {(i.transformers_version, f"pytorch{i.pytorch_version}") for i in training_images(config)}
    versions: dict[str, dict[str, Any]] = {}
    for tv, by_framework in scope["versions"].items():  # in the file's order, so refreshes diff small
        for framework, entry in by_framework.items():
            if (tv, framework) in used:
                versions.setdefault(tv, {})[framework] = {key: entry[key] for key in _SNAPSHOT_KEYS if key in entry}
    training: dict[str, Any] = {"versions": versions}
    if "processors" in scope:
        training = {"processors": scope["processors"], **training}
    return {
        "source": source,
        "file": "/".join(_CONFIG_RELPATH),
        "refresh": "python -m distrain_cloud.launcher.backends.sagemaker.images --refresh-snapshot",
        "training": training,
    }


def refresh_snapshot(path: str = SNAPSHOT_PATH) -> str:
    """Rewrite the snapshot from the installed sagemaker-core; returns what it was taken from."""
    config_path = image_config_path()
    if config_path is None:
        raise UserError("refreshing the image snapshot needs sagemaker-core: pip install 'distrain-cloud[sagemaker]'")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    source = f"sagemaker-core {_sagemaker_core_version()}"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(snapshot_of(config, source), f, indent=2)
        f.write("\n")
    return source


def _training_scope(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if config is None:
        config = default_image_config().config
    scope: Mapping[str, Any] = config.get("training", config)
    return scope


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.\-+]", version))


def training_images(config: Mapping[str, Any] | None = None) -> tuple[TrainingImage, ...]:
    """Every Hugging Face PyTorch training image in the config, newest first.

    `config` is the parsed huggingface.json (or its "training" part); by default
    sagemaker-core's, or the shipped snapshot of it. Entries without a container_version for a processor are left out:
    their tag names no CUDA version, so nothing could vouch for them (transformers 4.4/4.5).
    """
    scope = _training_scope(config)
    scope_processors = scope.get("processors") or ["gpu"]
    found = []
    for tv, by_framework in scope["versions"].items():
        if not isinstance(by_framework, Mapping):
            continue
        for fw, entry in by_framework.items():
            if not fw.startswith("pytorch") or not isinstance(entry, Mapping) or "repository" not in entry:
                continue
            py_versions = entry.get("py_versions") or []
            if not py_versions:
                continue
            py = max(py_versions, key=lambda p: _version_key(p[2:]) if p[2:].isdigit() else (0,))
            containers = entry.get("container_version") or {}
            for processor in entry.get("processors") or scope_processors:
                container = containers.get(processor)
                if not container:
                    continue
                cuda = parse_cuda_version(container)
                if processor != "cpu" and cuda is None:
                    continue
                found.append(
                    TrainingImage(
                        transformers_version=tv,
                        pytorch_version=fw[len("pytorch") :],
                        py_version=py,
                        processor=processor,
                        container_version=container,
                        cuda_version=None if processor == "cpu" or cuda is None else f"{cuda[0]}.{cuda[1]}",
                        repository=entry["repository"],
                        registries=dict(entry.get("registries") or {}),
                    )
                )
    found.sort(key=lambda i: (_version_key(i.transformers_version), _version_key(i.pytorch_version)), reverse=True)
    return tuple(found)


def known_regions(config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """Regions where the config publishes at least one Hugging Face PyTorch training image."""
    return tuple(sorted({r for image in training_images(config) for r in image.registries}))


# ---------------------------------------------------------------------------------------
# Choosing


def _matches(requested: str | None, version: str) -> bool:
    """ "4.56" and "4.56.2" both match 4.56.2; "2.8" matches PyTorch 2.8.0."""
    if requested is None:
        return True
    requested = requested.strip().lower().removeprefix("pytorch").removeprefix("v")
    return version == requested or version.startswith(requested + ".")


def choose_training_image(
    instance: InstanceType,
    region: str,
    *,
    transformers_version: str | None = None,
    pytorch_version: str | None = None,
    image_uri: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> ImageChoice:
    """The Hugging Face PyTorch training image to run on `instance` in `region`.

    Default: the newest transformers/PyTorch pair whose CUDA build runs on the instance's
    GPU. `transformers_version` / `pytorch_version` ("4.56" or "4.56.2") narrow the choice;
    `image_uri` is taken as given unless its tag names a CUDA version the GPU cannot run.
    `config` replaces sagemaker-core's huggingface.json (tests); without it the reason names
    the image config used (installed sagemaker-core or the shipped snapshot).
    Raises UserError naming the flag to change.
    """
    if image_uri:
        return _check_explicit(instance, region, image_uri, transformers_version, pytorch_version, config)

    regions = known_regions(config)
    if region not in regions:
        raise UserError(
            f"unknown region {region!r} (--region): Hugging Face training images are published in " + ", ".join(regions)
        )

    processor = "gpu" if instance.is_gpu else "cpu"
    images = [i for i in training_images(config) if i.processor == processor]
    if not images:
        raise UserError(
            f"{instance.name} has no GPU and {image_config_source()} lists only GPU builds of the "
            "Hugging Face training image; choose a GPU instance type (--instance, e.g. ml.g5.xlarge), "
            "or pass --image-uri with a CPU image"
        )

    pinned = [
        i
        for i in images
        if _matches(transformers_version, i.transformers_version) and _matches(pytorch_version, i.pytorch_version)
    ]
    if not pinned:
        asked = " and ".join(
            f"{flag}: {value}"
            for flag, value in ((TRANSFORMERS_KEY, transformers_version), (PYTORCH_KEY, pytorch_version))
            if value
        )
        pairs = ", ".join(f"{i.transformers_version}/{i.pytorch_version}" for i in images)
        raise UserError(f"no Hugging Face training image matches {asked}; transformers/PyTorch pairs: {pairs}")

    in_region = [i for i in pinned if region in i.registries]
    if not in_region:
        raise UserError(
            f"{pinned[0].label} images are not published in {region} (--region); "
            f"they are in: {', '.join(sorted(pinned[0].registries))}"
        )

    runnable = [i for i in in_region if i.runs_on(instance)]
    newest = in_region[0]
    if not runnable:
        raise UserError(_pinned_incompatible(instance, region, newest, transformers_version, pytorch_version, config))

    pick = runnable[0]
    pinning = bool(transformers_version or pytorch_version)
    if not pinning:
        # Falling back by years to what an odd region still carries would surprise anyone:
        # say so, and let them pin that image or move region.
        best = next(i for i in pinned if i.runs_on(instance))
        if best is not pick:
            elsewhere = next(
                (r for r in ("us-east-1", "us-west-2", "eu-west-1") if r in best.registries), sorted(best.registries)[0]
            )
            raise UserError(
                f"the newest Hugging Face training image for {instance.name} ({best.label}) is not published in "
                f"{region}, where the newest is {pick.label}; pin that with {TRANSFORMERS_KEY}: "
                f"{pick.transformers_version!r} and {PYTORCH_KEY}: {pick.pytorch_version!r} in the job spec, "
                f"or use --region {elsewhere}"
            )
    return ImageChoice(
        uri=pick.uri(region),
        transformers_version=pick.transformers_version,
        pytorch_version=pick.pytorch_version,
        py_version=pick.py_version,
        cuda_version=pick.cuda_version,
        reason=_reason(instance, region, pick, newest, pinned[0], pinning)
        + ("" if config is not None else f"; image list: {image_config_source()}"),
    )


def _reason(
    instance: InstanceType,
    region: str,
    pick: TrainingImage,
    newest: TrainingImage,
    newest_anywhere: TrainingImage,
    pinned: bool,
) -> str:
    build = f"CUDA {pick.cuda_version}" if pick.cuda_version else "CPU build"
    what = "newest pinned image" if pinned else "newest image"
    if pick is not newest:
        why = cuda_incompatibility(newest.cuda, instance)
        return (
            f"{what} that runs on {instance.gpu_model} ({build}); {newest.label} is a "
            f"CUDA {newest.cuda_version} build ({why})"
        )
    if newest is not newest_anywhere:
        return f"{what} published in {region} ({build}); {newest_anywhere.label} is not"
    return f"{what} ({build})"


def _pinned_incompatible(
    instance: InstanceType,
    region: str,
    image: TrainingImage,
    transformers_version: str | None,
    pytorch_version: str | None,
    config: Mapping[str, Any] | None,
) -> str:
    why = cuda_incompatibility(image.cuda, instance)
    flags = " and ".join(
        flag for flag, value in ((TRANSFORMERS_KEY, transformers_version), (PYTORCH_KEY, pytorch_version)) if value
    )
    msg = f"{image.label} is a CUDA {image.cuda_version} build, which cannot run on {instance.name} ({why})"
    if not flags:  # nothing pinned, and still nothing runs: only an explicit image can help
        return (
            f"no Hugging Face training image of {image_config_source()} runs on {instance.name}: "
            f"the newest, {msg}; pass --image-uri and {_cuda_advice(instance)}"
        )
    try:
        default = choose_training_image(instance, region, config=config)
    except UserError:
        return f"{msg}; {_cuda_advice(instance)}"
    return (
        f"{msg}; drop {flags} to let distrain-cloud pick {default.transformers_version}/"
        f"{default.pytorch_version} ({default.uri})"
    )


def _tag_of(uri: str) -> str:
    """The tag of an image URI ("" when it has none, e.g. digest-only); a bare tag as is."""
    last = uri.rsplit("/", 1)[-1].split("@", 1)[0]
    if ":" in last:
        return last.split(":", 1)[1]
    return "" if ("/" in uri or "@" in uri) else last


def _check_explicit(
    instance: InstanceType,
    region: str,
    image_uri: str,
    transformers_version: str | None,
    pytorch_version: str | None,
    config: Mapping[str, Any] | None,
) -> ImageChoice:
    image_uri = image_uri.strip()
    tag = _tag_of(image_uri)
    m = _HF_TAG.match(tag)
    tag_tv, tag_pt = (m.group("transformers"), m.group("pytorch")) if m else (None, None)
    for flag, what, asked, found in (
        (TRANSFORMERS_KEY, "transformers", transformers_version, tag_tv),
        (PYTORCH_KEY, "PyTorch", pytorch_version, tag_pt),
    ):
        if asked and found and not _matches(asked, found):
            raise UserError(f"--image-uri is a {what} {found} image but {flag} asks for {asked}; drop one of them")
    py = _PY_IN_TAG.search(tag)
    cuda = parse_cuda_version(tag)

    def described(cuda_version: str | None, reason: str) -> ImageChoice:
        return ImageChoice(
            uri=image_uri,
            transformers_version=tag_tv or transformers_version,
            pytorch_version=tag_pt or pytorch_version,
            py_version=py.group(1) if py else None,
            cuda_version=cuda_version,
            reason=reason,
        )

    if cuda is None:
        return described(None, "explicit image, CUDA version unknown")
    cuda_str = f"{cuda[0]}.{cuda[1]}"
    if not instance.is_gpu:
        return described(cuda_str, f"explicit image (CUDA {cuda_str} build on a CPU instance)")
    why = cuda_incompatibility(cuda, instance)
    if why is None:
        return described(cuda_str, f"explicit image, CUDA {cuda_str} runs on {instance.gpu_model}")
    fix = _cuda_advice(instance)
    try:
        default = choose_training_image(
            instance, region, transformers_version=None, pytorch_version=None, config=config
        )
        fix = f"drop --image-uri to let distrain-cloud pick {default.uri}, or {fix}"
    except UserError:
        pass
    name = image_uri.rsplit("/", 1)[-1]
    raise UserError(f"image {name} is a CUDA {cuda_str} build, which cannot run on {instance.name} ({why}); {fix}")


def main(argv: list[str] | None = None) -> int:
    """`python -m distrain_cloud.launcher.backends.sagemaker.images`: the images in use and their source;
    `--refresh-snapshot` rewrites the shipped snapshot from the installed sagemaker-core."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m distrain_cloud.launcher.backends.sagemaker.images", description=main.__doc__
    )
    parser.add_argument("--refresh-snapshot", action="store_true", help="rewrite the snapshot from sagemaker-core")
    args = parser.parse_args(argv)
    if args.refresh_snapshot:
        try:
            source = refresh_snapshot()
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return err.exit_code
        default_image_config.cache_clear()
        print(f"snapshot {os.path.relpath(SNAPSHOT_PATH)} written from {source}")
    print(f"image list: {image_config_source()}")
    for image in training_images():
        print(f"  {image.label} ({image.py_version}, {image.processor}, {image.container_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
