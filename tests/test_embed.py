import numpy as np
import pytest
import torch

from hippo_gpu.config import EncoderConfig
from hippo_gpu.embed import Encoder


class CountingEncoder(Encoder):
    """Counts the texts that reach the model (to check the cache), numerics untouched."""

    seen = 0

    def _encode_raw(self, texts):
        CountingEncoder.seen += len(texts)
        return super()._encode_raw(texts)


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
