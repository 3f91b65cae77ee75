import numpy as np
import torch

from leanagent.models.chunking import length_chunks
from leanagent.models.retriever import PremiseRetriever


def covers(chunks, count):
    return [i for start, stop in chunks for i in range(start, stop)] == list(range(count))


def test_chunks_cover_the_rows_in_order_and_respect_max_rows():
    lengths = np.sort(np.random.default_rng(0).integers(1, 512, size=50))
    for max_rows, cost in ((1, 0.0), (7, 100.0), (64, 1e9)):
        chunks = length_chunks(lengths, max_rows, cost)
        assert covers(chunks, len(lengths))
        assert all(0 < stop - start <= max_rows for start, stop in chunks)


def test_free_calls_give_no_padding_and_costly_calls_give_one_chunk():
    lengths = np.array([3, 3, 5, 9, 9, 9])
    assert length_chunks(lengths, 64, 0.0) == [(0, 2), (2, 3), (3, 6)]
    assert length_chunks(lengths, 64, 1e9) == [(0, 6)]
    assert length_chunks(np.array([], dtype=np.int64), 64, 1.0) == []


def test_chunked_embeddings_match_one_padded_call():
    torch.manual_seed(0)
    model = PremiseRetriever(model_name="byt5-tiny").eval()
    lengths = torch.tensor([5, 40, 3, 17, 40, 1, 28])
    mask = (torch.arange(40)[None, :] < lengths[:, None]).long()
    ids = torch.randint(3, 259, mask.shape) * mask
    with torch.no_grad():
        whole = model.encoder(ids, mask)
        model.chunk_cost = 0.0
        chunked = model(ids, mask)
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-5)
