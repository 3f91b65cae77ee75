"""JSON that Python's json module parses (or fails on) in ways later code cannot use: each is one error line
naming the file (and line), not a traceback from a tokenizer or the parser's internals."""

from __future__ import annotations

import codecs
import json

import pytest

from leanagent.errors import LeanAgentError
from leanagent.io import iter_jsonl, read_json

# (JSON text of one string, whether it decodes to a string that UTF-8 cannot encode)
STRINGS = [
    (r'"a\ud800b"', True),
    (r'"\ud83d\ude00"', False),  # a pair: one emoji
    (r'"\uD83D\uDE00"', False),
    (r'"\\ud800"', False),  # an escaped backslash, then the letters "ud800"
    (r'"\\\ud800"', True),
    (r'"x\udc00"', True),
    (r'"\ud800\\udc00"', True),
    (r'"xd800\udc00"', True),
    (r'"\ud800\ud800\udc00"', True),
    (r'"\u00e9 and \u2200"', False),
]


@pytest.mark.parametrize("text,lone", STRINGS)
def test_a_lone_surrogate_is_refused_and_a_pair_is_kept(tmp_path, text, lone):
    decoded = json.loads(text)
    try:
        decoded.encode("utf-8")
        assert not lone, "the case table is wrong"
    except UnicodeEncodeError:
        assert lone, "the case table is wrong"
    path = tmp_path / "val.json"
    path.write_text('[\n{"state": ' + text + "}\n]\n")
    lines = tmp_path / "corpus.jsonl"
    lines.write_text('{"a": 1}\n{"state": ' + text + "}\n")
    if lone:
        with pytest.raises(LeanAgentError, match=r"val\.json:2: a string holds a lone UTF-16 surrogate"):
            read_json(path)
        with pytest.raises(LeanAgentError, match=r"corpus\.jsonl:2: a string holds a lone UTF-16 surrogate"):
            list(iter_jsonl(lines))
    else:
        assert read_json(path) == [{"state": decoded}]
        assert [r for _, r in iter_jsonl(lines)] == [{"a": 1}, {"state": decoded}]


@pytest.mark.parametrize(
    "body,reason",
    [("[" * 100_000 + "]" * 100_000, "nested too deeply"), ("[" + "9" * 5000 + "]", "more than 4300 digits")],
    ids=["deep", "long-integer"],
)
def test_json_that_the_parser_cannot_hold_is_one_error(tmp_path, body, reason):
    path = tmp_path / "train.json"
    path.write_text(body)
    with pytest.raises(LeanAgentError, match=rf"train\.json: malformed JSON \(.*{reason}"):
        read_json(path)
    lines = tmp_path / "corpus.jsonl"
    lines.write_text('{"a": 1}\n' + body + "\n")
    with pytest.raises(LeanAgentError, match=rf"corpus\.jsonl:2: malformed JSON line \(.*{reason}"):
        list(iter_jsonl(lines))


def test_a_byte_order_mark_opening_a_file_is_skipped_and_one_elsewhere_is_an_error(tmp_path):
    bom = codecs.BOM_UTF8
    (tmp_path / "val.json").write_bytes(bom + b'[{"state": "x"}]\n')
    assert read_json(tmp_path / "val.json") == [{"state": "x"}]
    (tmp_path / "corpus.jsonl").write_bytes(bom + b'{"a": 1}\n{"b": 2}\n')
    assert list(iter_jsonl(tmp_path / "corpus.jsonl")) == [(1, {"a": 1}), (2, {"b": 2})]
    (tmp_path / "corpus.jsonl").write_bytes(b'{"a": 1}\n' + bom + b'{"b": 2}\n')  # not where an editor puts one
    with pytest.raises(LeanAgentError, match=r"corpus\.jsonl:2: malformed JSON line"):
        list(iter_jsonl(tmp_path / "corpus.jsonl"))


def test_a_key_given_twice_in_one_object_is_refused_and_the_same_key_in_other_objects_is_not(tmp_path):
    """json keeps the last of two values and drops the other without a word: a theorem named twice, a
    corpus file with two import lists, is a damaged file."""
    path = tmp_path / "val.json"
    path.write_text('[{"file_path": "A.lean", "full_name": "t", "traced_tactics": [{"tactic": "simp"}]},\n'
                    ' {"file_path": "A.lean", "full_name": "u", "full_name": "v"}]\n')
    with pytest.raises(LeanAgentError, match=r"val\.json: 'full_name' is given twice in one object \(the one with "
                                             r"full_name 'u'\)"):
        read_json(path)
    lines = tmp_path / "corpus.jsonl"
    lines.write_text('{"path": "A.lean", "imports": []}\n{"path": "B.lean", "imports": [], "premises": [], "imports": ["A"]}\n')
    with pytest.raises(LeanAgentError, match=r"corpus\.jsonl:2: 'imports' is given twice in one object \(the one with path 'B.lean'\)"):
        list(iter_jsonl(lines))
    path.write_text('[{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}]')
    assert read_json(path) == [{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}]
