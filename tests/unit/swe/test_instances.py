"""SWE instances in every variant and every storage form, and the errors for bad ones."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from polar.errors import ConfigError
from polar.swe.instances import SWEInstance, load_instances

from .records import GYM, SMITH, VERIFIED


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_verified_record_has_its_json_string_test_lists_decoded() -> None:
    instance = SWEInstance.model_validate(VERIFIED)
    assert instance.FAIL_TO_PASS == [
        "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"
    ]
    assert len(instance.PASS_TO_PASS) == 2
    assert instance.version == "4.3"
    assert instance.extra == {"created_at": "2022-03-03T15:14:54Z", "difficulty": "15 min - 1 hour"}
    assert instance.image_name is None
    assert instance.variant == "swe-bench"


def test_a_gym_record_keeps_its_lists_and_is_named_by_its_source() -> None:
    instance = SWEInstance.model_validate({**GYM, "source": "SWE-Gym/SWE-Gym"})
    assert GYM["FAIL_TO_PASS"] == instance.FAIL_TO_PASS
    assert instance.hints_text == "Thanks for raising this"
    assert instance.variant == "swe-gym"


def test_a_smith_record_has_its_image_and_no_test_patch_or_base_commit() -> None:
    instance = SWEInstance.model_validate(SMITH)
    assert instance.image_name == SMITH["image_name"]
    assert instance.test_patch == ""
    assert instance.base_commit is None
    assert instance.variant == "swe-smith"


def test_absent_text_and_numbers_are_normalized() -> None:
    record = {**GYM, "hints_text": None, "test_patch": None, "version": 0.2, "PASS_TO_PASS": None}
    instance = SWEInstance.model_validate(record)
    assert (instance.hints_text, instance.test_patch) == ("", "")
    assert instance.version == "0.2"
    assert instance.PASS_TO_PASS == []


def test_the_task_trees_image_field_and_a_test_command_list_are_understood() -> None:
    instance = SWEInstance.model_validate(
        {**GYM, "image": "swebench/sweb.eval.x86_64.x:latest", "test_cmd": ["make", "pytest -rA"]}
    )
    assert instance.image_name == "swebench/sweb.eval.x86_64.x:latest"
    assert instance.test_cmd == "make && pytest -rA"


def test_jsonl_and_json_files_load(tmp_path: Path) -> None:
    jsonl = _jsonl(tmp_path / "instances.jsonl", [VERIFIED, GYM, SMITH])
    loaded = load_instances(jsonl)
    assert [i.instance_id for i in loaded] == [
        VERIFIED["instance_id"],
        GYM["instance_id"],
        SMITH["instance_id"],
    ]
    assert loaded[0].source == str(jsonl)
    as_json = tmp_path / "instances.json"
    as_json.write_text(json.dumps([VERIFIED, SMITH]))
    assert [i.instance_id for i in load_instances(str(as_json))] == [
        VERIFIED["instance_id"],
        SMITH["instance_id"],
    ]


def test_parquet_files_and_split_directories_load(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    shared = sorted(set(VERIFIED) & set(GYM))  # one schema: the test lists as JSON strings
    gym = {k: GYM[k] for k in shared}
    gym |= {"FAIL_TO_PASS": json.dumps(GYM["FAIL_TO_PASS"]), "PASS_TO_PASS": "[]"}
    rows = [{k: VERIFIED[k] for k in shared}, gym]
    file = tmp_path / "verified.parquet"
    pq.write_table(pa.Table.from_pylist(rows), file)
    assert [i.FAIL_TO_PASS for i in load_instances(file)] == [
        json.loads(VERIFIED["FAIL_TO_PASS"]),
        GYM["FAIL_TO_PASS"],
    ]

    # A Hub snapshot's layout: data/<split>-00000-of-00001.parquet; "test" is the default.
    data = tmp_path / "snapshot" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:1]), data / "test-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[1:]), data / "dev-00000-of-00001.parquet")
    assert [i.instance_id for i in load_instances(tmp_path / "snapshot")] == [
        VERIFIED["instance_id"]
    ]
    dev = load_instances(tmp_path / "snapshot", split="dev")
    assert [i.instance_id for i in dev] == [GYM["instance_id"]]
    with pytest.raises(ConfigError, match=r"no split 'train' \(splits: dev, test\)"):
        load_instances(tmp_path / "snapshot", split="train")


def test_a_hub_name_reads_the_local_hub_cache_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snapshot = tmp_path / "datasets--SWE-Gym--SWE-Gym" / "snapshots" / "abc123"
    (snapshot / "data").mkdir(parents=True)
    _jsonl(snapshot / "data" / "train.jsonl", [GYM])
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    _no_network(monkeypatch)

    [instance] = load_instances("SWE-Gym/SWE-Gym")
    assert instance.instance_id == GYM["instance_id"]
    assert instance.variant == "swe-gym"
    with pytest.raises(ConfigError, match=r"no Hugging Face dataset .*hf download"):
        load_instances("polar-tests/no-such-dataset")


def test_datasets_save_to_disk_directories_load(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{**GYM}, {**GYM, "instance_id": "getmoto__moto-5753"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    assert len(load_instances(tmp_path / "one")) == 2
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
    ).save_to_disk(str(tmp_path / "dict"))
    assert len(load_instances(tmp_path / "dict")) == 1
    assert len(load_instances(tmp_path / "dict", split="train")) == 2


def test_a_malformed_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    bad_json = tmp_path / "a.jsonl"
    bad_json.write_text(json.dumps(GYM) + "\n\n{not json\n")
    with pytest.raises(ConfigError, match=rf"{bad_json}:3: not a JSON object"):
        load_instances(bad_json)

    bad_lists = _jsonl(tmp_path / "b.jsonl", [VERIFIED, {**GYM, "FAIL_TO_PASS": "[oops"}])
    with pytest.raises(ConfigError, match=rf"{bad_lists}:2: invalid SWE instance \(getmoto") as e:
        load_instances(bad_lists)
    assert "FAIL_TO_PASS is a string but not a JSON list" in str(e.value)

    missing = _jsonl(tmp_path / "c.jsonl", [{"repo": "a/b"}])
    with pytest.raises(ConfigError, match=r"c.jsonl:1: invalid SWE instance:\n  instance_id"):
        load_instances(missing)

    not_objects = tmp_path / "d.json"
    not_objects.write_text(json.dumps([VERIFIED, ["x"]]))
    with pytest.raises(ConfigError, match=r"d.json\[1\]: expected an instance"):
        load_instances(not_objects)


def test_a_repeated_instance_id_names_both_places(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "dup.jsonl", [VERIFIED, GYM, VERIFIED])
    with pytest.raises(
        ConfigError,
        match=rf"dup.jsonl:3: .*'{VERIFIED['instance_id']}' repeats the one at {path}:1",
    ):
        load_instances(path)


def test_what_is_not_there_or_not_readable_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file or directory"):
        load_instances(tmp_path / "absent.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"expected .jsonl, .json or .parquet"):
        load_instances(tmp_path / "x.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="expected a datasets save_to_disk directory"):
        load_instances(tmp_path / "empty")


def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("SWE instances must load without the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
