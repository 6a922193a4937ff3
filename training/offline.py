"""The Hub out of reach: say so at once, and how to fix it, instead of a minute of the Hub
clients' retries ending in a line such as "Dataset X is not cached in None".

A model, tokenizer or data set named by Hub id is read from this machine's Hugging Face cache
when the Hub cannot be reached (HF_HUB_OFFLINE set, or no answer from its endpoint): the
libraries are put in offline mode before they ask, so one that is not cached fails in a
second, and `missing` words the error with the fix.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Iterator

PROBE_TIMEOUT_S = 5.0
PROBE_ATTEMPTS = 2  # the Hub clients' own retries take 30-60 s to give up on a machine with no route
_TRUE = {"1", "ON", "YES", "TRUE"}


def _offline_env() -> bool:
    return any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


@functools.lru_cache(maxsize=1)
def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached from here ("HF_HUB_OFFLINE is set", "cannot reach
    https://huggingface.co: ..."), or None. At most PROBE_ATTEMPTS requests of PROBE_TIMEOUT_S,
    once per process, through huggingface_hub's own client (so its proxy settings count); any HTTP answer,
    even an error status, means the Hub is there."""
    if _offline_env():
        return "HF_HUB_OFFLINE is set"
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    reason = ""
    for attempt in range(PROBE_ATTEMPTS):
        if attempt:
            time.sleep(1.0)  # a blip passes; a machine with no route says the same again
        try:
            get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
            return None
        except Exception as e:  # noqa: BLE001 - any transport failure (DNS, refused, timeout, TLS) is "out of reach"
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"cannot reach {constants.ENDPOINT}: {reason[:200]}"


def use_cache_only_if_unreachable(name: str | None) -> str | None:
    """Before loading `name` (a Hub id, or a local folder or file, which needs no Hub): if the
    Hub is out of reach, put huggingface_hub, transformers and datasets in offline mode, so a
    load that is not cached fails at once. Returns why the Hub is out of reach, or None."""
    if not name or os.path.exists(name):
        return None
    why = hub_unreachable()
    if why is not None:
        go_offline()
    return why


@contextlib.contextmanager
def hub_load(flag: str, name: str | None, error: type[Exception], *, dataset: bool = False) -> Iterator[None]:
    """Load `name` (given as `flag`) inside the block: from the cache alone where the Hub is out
    of reach, and a load that then fails (not cached) raises `error` with `missing`'s line."""
    why = use_cache_only_if_unreachable(name)
    try:
        yield
    except OSError as e:  # the Hub clients' "not cached" (ConnectionError and FileNotFoundError too)
        if why is None or name is None:
            raise
        raise error(missing(flag, name, why, dataset=dataset)) from e


def go_offline() -> None:
    """Offline mode for this process's Hub clients, also where they were imported already (each
    reads HF_HUB_OFFLINE into a constant at import)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
        datasets_config.HF_DATASETS_OFFLINE = True  # type: ignore[attr-defined]


def missing(flag: str, name: str, why: str, *, dataset: bool = False) -> str:
    """The one line for `name` (given as `flag`) that is not in this machine's cache while the
    Hub is out of reach: what, why, and the fixes (a folder downloaded where the Hub is reachable
    loads anywhere, with no cache and no network)."""
    from huggingface_hub import constants

    folder = name.rstrip("/").rsplit("/", 1)[-1] or "download"
    if dataset:
        fix = (
            f"run `hf download --repo-type dataset {name} --local-dir {folder}` where the Hub is reachable and "
            f"give {flag} the absolute path of {folder}, or use local data (--train-file FILE, builtin:sentiment)"
        )
    else:
        fix = (
            f"run `hf download {name} --local-dir {folder}` where the Hub is reachable and give {flag} the "
            f"absolute path of {folder} (or `hf download {name}` into the HF_HOME this machine reads), or build "
            "the model from a config offline (--preset tiny-gpt2, --model-config FILE)"
        )
    return (
        f"{flag} {name} is not in this machine's Hugging Face cache ({constants.HF_HOME}) and the Hub is out of "
        f"reach ({why}): {fix}"
    )
