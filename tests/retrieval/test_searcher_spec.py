"""SearcherSpec opens the same searcher as the hand-written recipe (threads, load_index,
Searcher, warm-up), survives pickling (Ray sends it to replicas) and refuses bad fields with a
ValueError naming them."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from hippo_gpu import Searcher, SearcherOptions, SearcherSpec, load_index
from hippo_gpu.config import MODES, RetrievalConfig
from hippo_gpu.retrieval.spec import DEFAULT_WARM_UP
from tests.helpers import QUERIES

ENTITIES = [["Skerrow"], ["Lumen Museum"], ["tidal clock"]]  # one list per query


def _assert_same_rankings(got: Searcher, want: Searcher) -> None:
    for mode in MODES:
        ents = ENTITIES if mode == "hipporag1" else None
        g = got.rank(QUERIES, top_k=10, mode=mode, query_entities=ents)
        w = want.rank(QUERIES, top_k=10, mode=mode, query_entities=ents)
        assert torch.equal(g.passage_rows, w.passage_rows), mode
        torch.testing.assert_close(g.scores, w.scores, rtol=0, atol=0)
        assert torch.equal(g.dense_fallback, w.dense_fallback), mode


def test_open_ranks_as_the_manual_recipe(sample_index_dir: Path, sample_searcher: Searcher):
    """The fixture's searcher is the recipe by hand: Searcher(load_index(dir, device="cpu"));
    the spec crosses a pickle first, as it does on its way to a Ray replica."""
    spec = SearcherSpec(sample_index_dir, device="cpu", threads=torch.get_num_threads(),
                        warm_up=("dense",))
    opened = pickle.loads(pickle.dumps(spec)).open()
    assert opened.index.version == sample_searcher.index.version
    assert opened.encoder_config == sample_searcher.encoder_config
    assert opened.config == RetrievalConfig()
    _assert_same_rankings(opened, sample_searcher)


def test_open_with_precision_and_config_as_the_manual_recipe(sample_index_dir: Path):
    cfg = RetrievalConfig(dtype="float64", linking_top_k=3)
    spec = SearcherSpec(sample_index_dir, device="cpu", precision="bfloat16",
                        options=SearcherOptions(query_backend="torch"), config=cfg)
    manual = Searcher(load_index(sample_index_dir, device="cpu", precision="bfloat16"), cfg,
                      SearcherOptions(query_backend="torch"))
    opened = spec.open()
    assert opened.index.precision == "bfloat16" and opened.config == cfg
    assert opened.encoder_config == manual.encoder_config
    _assert_same_rankings(opened, manual)


def test_open_takes_an_index_already_loaded(sample_index_dir: Path, sample_index,
                                            sample_searcher: Searcher):
    opened = SearcherSpec(sample_index_dir, device="cpu").open(sample_index)
    assert opened.index is sample_index
    with pytest.raises(ValueError, match="at float32; the spec asks for cpu at float16"):
        SearcherSpec(sample_index_dir, device="cpu", precision="float16").open(sample_index)
    with pytest.raises(ValueError, match="built with encoder"):
        SearcherSpec(sample_index_dir, device="cpu", encoder_model="other/model").open(
            sample_index)


def test_pickle_round_trip_and_normalised_fields(tmp_path: Path):
    spec = SearcherSpec(str(tmp_path), device="cuda:1", precision="float16",
                        options=SearcherOptions(query_precision="bfloat16",
                                                query_backend="onnx",
                                                cache_dir=str(tmp_path / "cache")), threads=3,
                        warm_up=["dense", "hybrid"], config=RetrievalConfig(dtype="float64"),
                        encoder_model="some/encoder")
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and hash(back) == hash(spec)
    assert back.index == tmp_path and back.options.cache_dir == tmp_path / "cache"  # str -> Path
    assert back.warm_up == back.warm_up_modes == ("dense", "hybrid")  # a list -> a tuple
    assert SearcherSpec(tmp_path, warm_up=True).warm_up_modes == DEFAULT_WARM_UP
    assert SearcherSpec(tmp_path).warm_up_modes == ()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("index", "", "index must be an index directory path"),
    ("device", "gpu0", "unknown device 'gpu0'"),
    ("precision", "float64", "precision must be one of"),
    ("options", {"query_backend": "torch"}, "options must be a SearcherOptions"),
    ("options", SearcherOptions(query_base_url="http://x/v1"), "name the server in encoder_model"),
    ("threads", 0, "threads must be None or >= 1"),
    ("warm_up", ("dense", "fast"), r"warm_up modes must be among .* \['fast'\]"),
    ("warm_up", "dense", "warm_up must be a bool or a sequence of modes"),
    ("config", {"dtype": "float64"}, "config must be a RetrievalConfig"),
    ("encoder_model", "", "encoder_model must be None or a non-empty"),
])
def test_bad_field_is_a_clear_value_error(tmp_path: Path, field: str, value, message: str):
    kwargs = {"index": tmp_path, field: value}
    with pytest.raises(ValueError, match=message):
        SearcherSpec(**kwargs)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("query_precision", "int8", "query_precision must be None or one of"),
    ("query_backend", "tensorrt", "query_backend must be one of"),
    ("query_batch_size", 0, "query_batch_size must be None or an int >= 1"),
])
def test_bad_option_is_a_clear_value_error(field: str, value, message: str):
    with pytest.raises(ValueError, match=message):
        SearcherOptions(**{field: value})


def test_a_searcher_over_another_version_keeps_its_options_and_encoder(sample_searcher):
    opts = SearcherOptions(query_backend="torch", query_batch_size=7)
    first = Searcher(sample_searcher.index, options=opts, encoder=sample_searcher.encoder)
    other = first.over(sample_searcher.index)
    assert other.options is opts and other.encoder_config == first.encoder_config
    assert other.loaded_encoder is sample_searcher.encoder
    assert other.encoder_config.query_batch_size == 7


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_cuda_spec_is_made_anywhere_and_refused_where_it_is_opened(sample_index_dir: Path):
    spec = SearcherSpec(sample_index_dir, device="cuda")  # a driver may send it to a GPU node
    with pytest.raises(ValueError, match="CUDA is not available"):
        spec.open()
