"""BM25: the Lean tokenizer, batch scores against bm25s's own, and accessibility of what it returns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import load_tactic_states
from leanagent.errors import LeanAgentError
from leanagent.retrieval.bm25 import BM25Index, LeanTokenizer, masked_topk


def test_qualified_names_split_at_dots_and_underscores_and_keep_the_whole_name():
    tokens = LeanTokenizer()("Nat.le_of_lt_succ")
    assert tokens[:5] == ["nat", "le", "of", "lt", "succ"]
    assert "nat.le_of_lt_succ" in tokens
    assert LeanTokenizer(keep_whole=False)("Nat.le_of_lt_succ") == ["nat", "le", "of", "lt", "succ"]
    assert LeanTokenizer(split=False, lowercase=False)("Nat.le_of_lt_succ") == ["Nat.le_of_lt_succ"]


def test_camel_case_is_split_only_when_asked():
    assert LeanTokenizer(keep_whole=False)("List.foldlM HEq.refl") == ["list", "foldl", "m", "h", "eq", "refl"]
    assert LeanTokenizer(keep_whole=False, camel=False)("List.foldlM") == ["list", "foldlm"]


@pytest.mark.parametrize("symbol", ["≤", "∘", "⁻¹", "→", "∀"])
def test_math_symbols_are_tokens_of_their_own(symbol):
    tokens = LeanTokenizer()(f"a{symbol}b")
    assert symbol in tokens and "a" in tokens and "b" in tokens
    assert symbol not in LeanTokenizer(symbols=False)(f"a{symbol}b")


def test_inverse_is_one_token_and_subscripted_names_stay_whole():
    assert LeanTokenizer()("x⁻¹ * h₁") == ["x", "⁻¹", "*", "h₁"]
    assert LeanTokenizer(lowercase=False)("(h₁ : a ≤ b)") == ["(", "h₁", ":", "a", "≤", "b", ")"]


def test_whitespace_baseline_and_document_text():
    assert LeanTokenizer(whitespace=True, lowercase=False)("f (x : ℕ)") == ["f", "(x", ":", "ℕ)"]
    assert LeanTokenizer(text="name").document("A.b", "theorem b") == "A.b"
    assert LeanTokenizer(text="both").document("A.b", "theorem b") == "A.b theorem b"
    with pytest.raises(LeanAgentError, match="text must be one of"):
        LeanTokenizer(text="docstring")


def test_batch_scores_equal_bm25s_scores_one_query_at_a_time(mini_dataset):
    corpus = Corpus.from_jsonl(mini_dataset / "corpus.jsonl")
    index = BM25Index(corpus)
    queries = load_tactic_states(mini_dataset / "random" / "val.json", corpus).states[:8] + ["qqqzzz wwxxyy"]
    batch = index.scores(queries)
    assert batch.shape == (len(queries), len(corpus)) and batch.dtype == torch.float32
    for row, query in zip(batch, queries):
        ids = [index.vocab[t] for t in index.tokenizer(query) if t in index.vocab]
        expected = index.bm25.get_scores(ids) if ids else np.zeros(len(corpus), dtype=np.float32)
        np.testing.assert_allclose(row.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert batch[-1].abs().sum() == 0  # a query sharing no term scores nothing
    assert (batch[:-1].amax(dim=1) > 0).all()


def test_bm25_never_returns_an_inaccessible_premise(toy_dataset):
    corpus = Corpus.from_jsonl(toy_dataset / "corpus.jsonl")
    index = BM25Index(corpus)
    # Every file at every position of interest, with a query naming every premise (all score > 0).
    query = " ".join(corpus.names)
    cases = [(f, line << 24) for f in range(corpus.num_files) for line in (0, 5, 11, 25, 40)]
    file_ids = torch.tensor([f for f, _ in cases])
    pos_keys = torch.tensor([p for _, p in cases])
    scores = index.scores([query] * len(cases))
    assert (scores > 0).all()
    ids, top = masked_topk(scores, corpus.accessible_mask(file_ids, pos_keys), k=len(corpus))
    for (f, pos), row, row_scores in zip(cases, ids.tolist(), top):
        returned = [p for p in row if p >= 0]
        assert sorted(returned) == corpus.accessible_ids(f, pos).tolist()
        assert torch.isinf(row_scores[len(returned):]).all()


_FAKE_JAX_LAX = '''
import os, pathlib
def top_k(scores, k):
    # Where a GPU JAX would initialise: record the platforms it was allowed, and fail as a GPU already
    # taken by another rank's JAX does.
    platforms = os.environ.get("JAX_PLATFORMS", "")
    pathlib.Path(os.environ["FAKE_JAX_RECORD"]).write_text(platforms)
    if platforms != "cpu":
        raise RuntimeError("Unable to initialize backend 'cuda': CUDA_ERROR_OUT_OF_MEMORY (this test's fake JAX)")
    return scores[:k], list(range(k))
'''


@pytest.mark.slow
@pytest.mark.parametrize("user_platforms", [None, "cuda"])
def test_importing_bm25_keeps_an_installed_jax_off_the_gpu_unless_the_user_chose(tmp_path, user_platforms):
    """bm25s runs a JAX top-k at import: with a GPU JAX installed, every rank would take 75% of the GPU."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text("")
    (tmp_path / "jax" / "lax.py").write_text(_FAKE_JAX_LAX)
    record = tmp_path / "platforms"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    repo = Path(__file__).resolve().parents[1]
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{repo}", FAKE_JAX_RECORD=str(record))
    if user_platforms:
        env["JAX_PLATFORMS"] = user_platforms
    done = subprocess.run([sys.executable, "-c", "import leanagent.retrieval.bm25"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert record.read_text() == (user_platforms or "cpu")  # bm25s did reach the fake JAX
    if user_platforms:
        assert done.returncode != 0 and "Unable to initialize backend" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
