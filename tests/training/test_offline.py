"""training/offline.py: a Hub model or data set that is not cached, with the Hub out of reach
without HF_HUB_OFFLINE set, fails at once naming the fix, instead of after the Hub clients'
30-60 s of retries (tests/training/test_bad_input.py has the HF_HUB_OFFLINE cases, end to end)."""

from __future__ import annotations

import socket
import time

import pytest

from distrain_cloud.training import offline
from distrain_cloud.training.args import ArgumentError, parse_args


@pytest.fixture
def unreachable_hub(monkeypatch):
    """No HF_HUB_OFFLINE, and a Hub endpoint nothing listens on; everything offline mode changes
    is put back afterwards."""
    import datasets
    from huggingface_hub import constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: a connection is refused at once
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    offline.hub_unreachable.cache_clear()
    yield f"http://127.0.0.1:{port}"
    offline.hub_unreachable.cache_clear()


@pytest.mark.slow  # imports transformers (and torch) in this process: ~2.5 s where nothing did yet
def test_a_model_not_cached_fails_at_once_naming_the_fix(unreachable_hub):
    from distrain_cloud.training import modeling

    started = time.monotonic()
    with pytest.raises(ArgumentError) as e:
        modeling.load_tokenizer(parse_args(["--model", "someone/absent-model"]))
    assert time.monotonic() - started < 5  # was 60+ s of retries
    message = str(e.value)
    assert message.startswith("--model someone/absent-model is not in this machine's Hugging Face cache (")
    assert f"the Hub is out of reach (cannot reach {unreachable_hub}: " in message
    assert "run `hf download someone/absent-model --local-dir absent-model` where the Hub is reachable" in message
    assert message.endswith("or build the model from a config offline (--preset tiny-gpt2, --model-config FILE)")


def test_a_data_set_not_cached_fails_at_once_naming_the_fix(unreachable_hub, tmp_path):
    from distrain_cloud.training.contract import Contract
    from distrain_cloud.training.data import DataError, load_raw

    contract = Contract(model_dir=tmp_path / "m", output_dir=tmp_path / "o", checkpoint_dir=tmp_path / "c")
    started = time.monotonic()
    with pytest.raises(DataError) as e:
        load_raw(parse_args(["--dataset", "someone/absent-data"]), contract)
    assert time.monotonic() - started < 5  # was 30 s of retries, then "Couldn't reach ... on the Hub"
    message = str(e.value)
    assert message.startswith("--dataset someone/absent-data is not in this machine's Hugging Face cache (")
    assert "`hf download --repo-type dataset someone/absent-data --local-dir absent-data`" in message


def test_a_local_folder_never_asks_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(offline, "hub_unreachable", lambda: pytest.fail("the Hub was asked"))
    assert offline.use_cache_only_if_unreachable(str(tmp_path)) is None
