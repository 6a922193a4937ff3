"""Package discovery for the one thing pyproject.toml cannot say: the repository shows
launcher/ training/ infra/, and installed they live under the `distrain_cloud` namespace
(`distrain_cloud.launcher`, ...) so that generic names never collide in site-packages.

Every package under those folders is found (setuptools' find_namespace_packages), none is listed by hand.
Data files ship through MANIFEST.in (`include-package-data`): whatever sits in a package
folder ships, so a new script or asset cannot be left out of the wheel.
"""

from setuptools import find_namespace_packages, setup

ROOTS = ("launcher", "training", "infra")

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in ROOTS:
    # Namespace discovery: data folders (launcher/data, training/assets) are packages of their own to
    # setuptools, and its data files ship with them.
    for found in (root, *(f"{root}.{sub}" for sub in find_namespace_packages(root, exclude=["*__pycache__*"]))):
        name = f"distrain_cloud.{found}"
        packages.append(name)
        package_dir[name] = found.replace(".", "/")

setup(packages=packages, package_dir=package_dir)
