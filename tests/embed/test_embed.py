import json
import logging
import sys
import threading

import numpy as np
import pytest
import torch

from hippo_gpu.config import EncoderConfig
from hippo_gpu.embed import Encoder, length_buckets, onnx_backend, runnable_precision
from hippo_gpu.sample import paths


class CountingEncoder(Encoder):
    """Counts the texts that reach the model (to check the cache), numerics untouched."""

    seen = 0

    def _encode_raw(self, texts, batch_size=None):
        CountingEncoder.seen += len(texts)
        return super()._encode_raw(texts, batch_size)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return CountingEncoder(EncoderConfig(), torch.device("cpu"),
                           cache_dir=tmp_path_factory.mktemp("cache"))


def test_rows_are_normalised_and_order_preserved(encoder):
    texts = ["a much longer sentence about rivers and towns", "short", "short", "mid length"]
    e = encoder.encode(texts)
    assert e.shape == (4, 384) and e.dtype == torch.float32
    torch.testing.assert_close(e.norm(dim=1), torch.ones(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(e[1], e[2])
    alone = encoder._encode_raw([texts[0]])[0]
    np.testing.assert_allclose(e[0].numpy(), alone, atol=1e-5)


def test_cache_means_no_text_is_embedded_twice(encoder, tmp_path):
    CountingEncoder.seen = 0
    first = encoder.encode(["cache me", "and me"])
    assert CountingEncoder.seen == 2
    again = CountingEncoder(EncoderConfig(), torch.device("cpu"),
                            cache_dir=encoder.cache.dir.parent)
    CountingEncoder.seen = 0
    second = again.encode(["and me", "cache me", "new one"])
    assert CountingEncoder.seen == 1  # only the new text
    torch.testing.assert_close(second[:2], first.flip(0))


def test_query_instructions_are_prefixed():
    cfg = EncoderConfig(query_instructions={"query_to_fact": "find facts"})
    enc = Encoder(cfg, torch.device("cpu"))
    q = enc.encode_queries(["who?"], "query_to_fact")
    manual = enc.encode(["Instruct: find facts\nQuery: who?"])
    torch.testing.assert_close(q, manual, atol=1e-5, rtol=0)
    plain = enc.encode_queries(["who?"], "query_to_passage")
    assert not torch.allclose(plain, q)


def test_bad_config_rejected():
    with pytest.raises(ValueError):
        EncoderConfig(precision="int3")
    with pytest.raises(ValueError):
        EncoderConfig(batch_size=0)
    with pytest.raises(ValueError):
        EncoderConfig(backend="tensorrt")
    with pytest.raises(ValueError):  # the ONNX backend is float32 only
        EncoderConfig(backend="onnx", precision="bfloat16")


def test_backend_is_not_part_of_the_identity():
    ids = {json.dumps(EncoderConfig(backend=b).identity()) for b in ("torch", "onnx", "auto")}
    assert len(ids) == 1


@pytest.mark.parametrize("n,batch", [(1, 1), (7, 3), (64, 16), (5, 64)])
def test_length_buckets_sort_and_cover_every_row_once(n, batch):
    lengths = np.random.default_rng(n).integers(1, 50, n)
    buckets = length_buckets(lengths, batch)
    rows = np.concatenate(buckets)
    assert sorted(rows.tolist()) == list(range(n))
    assert all(len(b) <= batch for b in buckets)
    assert (np.diff(lengths[rows]) >= 0).all()  # longest-last: each batch pads little


# --- ONNX backend ------------------------------------------------------------------------------


def _sample_texts() -> tuple[list[str], list[str]]:
    """The bundled sample: 30 passages and 4 questions, plus awkward extra queries."""
    files = paths()
    passages = [p["title"] + "\n" + p["text"] for p in json.loads(files["corpus"].read_text())]
    questions = [q["question"] for q in json.loads(files["questions"].read_text())]
    questions += ["", "Harrowgate", "river " * 300]  # empty, one word, truncated at 256 tokens
    return passages, questions


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def onnx_pair(onnx_dir):
    """(torch encoder, ONNX encoder) for the default model; the ONNX one exports into onnx_dir."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    cpu = torch.device("cpu")
    return (Encoder(EncoderConfig(), cpu),
            Encoder(EncoderConfig(backend="onnx"), cpu, onnx_dir=onnx_dir))


def test_onnx_matches_torch_and_keeps_neighbours(onnx_pair):
    ref, fast = onnx_pair
    assert (ref.backend, fast.backend) == ("torch", "onnx")
    assert fast.onnx_parity is not None and fast.onnx_parity < 1e-5
    assert fast.onnx_export_seconds is not None and fast.onnx_export_seconds > 0  # exported now
    passages, questions = _sample_texts()
    p_ref, p_fast = ref.encode(passages), fast.encode(passages)
    q_ref = ref.encode_queries(questions, "query_to_passage")
    q_fast = fast.encode_queries(questions, "query_to_passage")
    torch.testing.assert_close(p_fast, p_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(q_fast, q_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(q_fast.norm(dim=1), torch.ones(len(questions)), atol=1e-5, rtol=0)
    k = 10  # passages ranked for every question, and each passage's nearest passages
    assert torch.equal((q_fast @ p_fast.T).topk(k).indices, (q_ref @ p_ref.T).topk(k).indices)
    assert torch.equal((p_fast @ p_fast.T).topk(k).indices, (p_ref @ p_ref.T).topk(k).indices)


@pytest.mark.parametrize("batch", [1, 2, 64])
def test_onnx_buckets_restore_the_callers_order(onnx_pair, batch):
    _, fast = onnx_pair
    passages, questions = _sample_texts()
    texts = questions + passages[:9]  # lengths from 2 to 256 tokens, unsorted
    one_by_one = np.stack([fast.onnx([t], 1)[0] for t in texts])
    np.testing.assert_allclose(fast.onnx(texts, batch), one_by_one, atol=1e-5, rtol=0)


def test_onnx_runs_with_torch_thread_count(onnx_pair):
    _, fast = onnx_pair
    opts = fast.onnx.session.get_session_options()
    assert opts.intra_op_num_threads == fast.onnx.threads == torch.get_num_threads()


def test_onnx_export_is_cached(onnx_pair, onnx_dir, monkeypatch):
    _, fast = onnx_pair
    path = fast.onnx.path
    assert path.parent.parent == onnx_dir and path.exists()
    mtime = path.stat().st_mtime_ns

    def no_export(*args, **kwargs):
        raise AssertionError("the cached export must be reused, not exported again")

    monkeypatch.setattr(onnx_backend, "export_onnx", no_export)
    again = Encoder(EncoderConfig(backend="auto"), torch.device("cpu"), onnx_dir=onnx_dir)
    assert again.backend == "onnx" and again.onnx_export_seconds is None
    assert again.onnx.path == path and path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in onnx_dir.iterdir()) == [path.parent.name]  # no temp left


def test_parity_failure_falls_back_to_torch_once(tmp_path, monkeypatch, caplog):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    monkeypatch.setattr(onnx_backend, "ONNX_PARITY_ATOL", -1.0)  # no export can pass this check
    cfg = EncoderConfig(backend="onnx")
    with caplog.at_level(logging.WARNING, logger="hippo_gpu.embed"):
        first = Encoder(cfg, torch.device("cpu"), onnx_dir=tmp_path)
        monkeypatch.setattr(onnx_backend, "export_onnx",
                            lambda *a, **k: pytest.fail("re-exported"))
        second = Encoder(cfg, torch.device("cpu"), onnx_dir=tmp_path)
    assert first.backend == second.backend == "torch"
    assert first.onnx is None and first.onnx_parity is None
    warned = [r for r in caplog.records if r.name == "hippo_gpu.embed.encoder"]
    assert len(warned) == 1 and "using torch" in warned[0].getMessage()
    assert not any(p.suffix == ".onnx" for p in tmp_path.rglob("*"))  # nothing published
    e = first.encode_queries(["who?"], "query_to_passage")
    torch.testing.assert_close(e, torch.from_numpy(first._encode_torch(["who?"])))


def test_missing_onnxruntime_falls_back_or_raises(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` -> ImportError
    auto = Encoder(EncoderConfig(backend="auto"), torch.device("cpu"), onnx_dir=tmp_path)
    assert auto.backend == "torch" and auto.onnx is None
    assert auto.encode_queries(["who?"], "query_to_passage").shape == (1, auto.dim)
    with pytest.raises(ImportError, match=r"hippo-gpu\[onnx\]"):
        Encoder(EncoderConfig(backend="onnx"), torch.device("cpu"), onnx_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_auto_keeps_torch_for_bfloat16(tmp_path):
    enc = Encoder(EncoderConfig(backend="auto", precision="bfloat16"), torch.device("cpu"),
                  onnx_dir=tmp_path)
    assert enc.backend == "torch" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model", ["hash:16", "sentence-transformers/all-MiniLM-L6-v2"])
def test_float16_is_refused_where_it_would_not_run(model):
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"'float16' does not run on device cpu"):
        Encoder(EncoderConfig(model=model, precision="float16"), cpu)
    assert runnable_precision("float16", cpu) == "float32"
    assert runnable_precision("float16", torch.device("cuda")) == "float16"
    assert runnable_precision("bfloat16", cpu) == "bfloat16"


def test_one_encoder_serves_concurrent_threads():
    """A writer and the readers of a served index share one Encoder. A Hugging Face fast
    tokenizer keeps its padding setting on one shared object, so a probe without padding
    (the query side's case check) racing a padded batch left that batch ragged ("Unable to
    create tensor", seen in CI). Three threads calling the tokenizer and the model together
    must each get what a lone call gets."""
    enc = Encoder(EncoderConfig(), torch.device("cpu"))
    texts = [("word " * n).strip() for n in range(1, 9)]  # unequal lengths: padded batches
    want = enc.encode_queries(texts, "query_to_passage")
    probe = enc.token_ids("A Probe Sentence")
    errors: list[str] = []
    stop = threading.Event()

    def embed() -> None:
        try:
            while not stop.is_set():
                got = enc.encode_queries(texts, "query_to_passage")
                assert torch.equal(got, want)
        except Exception as e:  # noqa: BLE001 - collected and asserted empty below
            errors.append(repr(e))
            stop.set()

    def tokenize() -> None:
        try:
            while not stop.is_set():
                assert enc.token_ids("A Probe Sentence") == probe
        except Exception as e:  # noqa: BLE001 - collected and asserted empty below
            errors.append(repr(e))
            stop.set()

    workers = [threading.Thread(target=f) for f in (embed, embed, tokenize)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the race window is a few bytecodes
    try:
        for w in workers:
            w.start()
        stop.wait(5.0)
        stop.set()
        for w in workers:
            w.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
