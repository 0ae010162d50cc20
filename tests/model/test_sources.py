"""Model resolution: bundled ids, local directories, a stubbed Hub client, sizes, trust_remote_code."""

from __future__ import annotations

import json

import pytest

from advisor.model.sources import resolve_model, resolve_size
from advisor.model.bundled import load_bundled_config
from tests.conftest import TINY_CONFIGS


def test_bundled_by_full_and_bare_name():
    assert resolve_model("Qwen/Qwen2.5-7B").total_params == 7_615_616_512
    assert resolve_model("qwen2.5-7b").name == "Qwen/Qwen2.5-7B"


def test_local_directory_and_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIGS["llama_gqa_untied"]))
    by_dir = resolve_model(str(tmp_path))
    by_file = resolve_model(str(tmp_path / "config.json"))
    # The tiny Llama by hand: 3 layers of 41,088 + embeddings and untied head 2 x 64,000 + final norm 64.
    assert by_dir.source == by_file.source == "local"
    assert by_dir.total_params == by_file.total_params == 251_328


def test_hub_uses_fetcher_only_for_config():
    calls = []

    def fake_fetch(repo_id):
        calls.append(repo_id)
        return load_bundled_config("openai-community/gpt2")

    spec = resolve_model("someone/my-gpt2", fetch_config=fake_fetch)
    assert calls == ["someone/my-gpt2"] and spec.source == "hub" and spec.total_params == 124_439_808


def test_hub_unreachable_names_bundled_ids():
    def offline(repo_id):
        from advisor.model.sources import unresolved_message

        raise ValueError(unresolved_message(repo_id, "ConnectionError"))

    with pytest.raises(ValueError, match="Qwen/Qwen2.5"):
        resolve_model("nobody/nothing", fetch_config=offline)


def test_real_hub_client_offline_is_clean(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # what the hub read at import
    with pytest.raises(ValueError, match="local directory"):
        resolve_model("nobody/definitely-not-cached")


def test_remote_code_refused_without_flag():
    cfg = {"model_type": "my_custom_arch", "auto_map": {"AutoConfig": "x.Config"}, "architectures": ["MyModel"]}
    with pytest.raises(ValueError, match="--trust-remote-code"):
        resolve_model("someone/custom", fetch_config=lambda _: cfg)


def test_size_only():
    spec = resolve_size("7.5B")
    assert spec.total_params == 7_500_000_000 and not spec.has_architecture
    for bad in ("", "abc", "-1B", "0", "7.5Q"):
        with pytest.raises(ValueError):
            resolve_size(bad)


@pytest.mark.parametrize("bad", ["", "   ", "not a model", "a/b/c/d", "x" * 10_000])
def test_bad_names(bad):
    with pytest.raises(ValueError):
        resolve_model(bad, fetch_config=lambda _: (_ for _ in ()).throw(ValueError("offline")))


def test_hub_client_asks_for_config_json_only(monkeypatch, tmp_path):
    """The real download function, with huggingface_hub's client stubbed: config.json from the cache."""
    import huggingface_hub

    cached = tmp_path / "config.json"
    cached.write_text(json.dumps(load_bundled_config("openai-community/gpt2")))
    calls = []

    def fake_download(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs))
        return str(cached)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    spec = resolve_model("someone/cached-gpt2")
    assert spec.total_params == 124_439_808
    assert calls == [("someone/cached-gpt2", "config.json", {"local_files_only": True})]


def _stub_hub(monkeypatch, *, head):
    """huggingface_hub with nothing cached: ``head`` stands in for the one probing request."""
    import huggingface_hub
    import huggingface_hub.utils

    downloads = []

    def fake_download(repo_id, filename, **kwargs):
        downloads.append(kwargs)
        if kwargs.get("local_files_only"):
            raise FileNotFoundError("not cached")
        raise OSError("404")

    class Session:
        def head(self, url, **kwargs):
            return head(url)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.utils, "get_session", lambda: Session())
    return downloads


def test_an_unreachable_hub_fails_at_once_without_the_downloads_retries(monkeypatch):
    """No route to the Hub: one request, no retrying download (huggingface_hub retries five times with
    backoff, about 23 s measured here before this check), and the line says the Hub is unreachable."""
    def no_route(url):
        raise ConnectionError("[Errno -2] Name or service not known")

    downloads = _stub_hub(monkeypatch, head=no_route)
    with pytest.raises(ValueError, match=r"^cannot load model 'someone/absent' \(the Hub is unreachable: "
                                         r"ConnectionError\)"):
        resolve_model("someone/absent")
    assert downloads == [{"local_files_only": True}]


def test_a_reachable_hub_downloads_config_json(monkeypatch):
    heads = []
    downloads = _stub_hub(monkeypatch, head=heads.append)
    with pytest.raises(ValueError, match=r"\(OSError\)"):
        resolve_model("someone/absent")
    assert len(heads) == 1 and heads[0].endswith("/someone/absent/resolve/main/config.json")
    assert downloads == [{"local_files_only": True}, {"etag_timeout": 10}]
