"""SWE-bench-format instances, whichever variant they come in and wherever they are stored.

SWE-bench (Verified, Lite) ships FAIL_TO_PASS and PASS_TO_PASS as JSON strings, SWE-Gym as
lists; SWE-smith adds ``image_name`` (its repos read ``swesmith/owner__repo.sha``), often has no
test_patch (the failing tests are already in the repository) and sometimes no base_commit;
SWE-bench's own task trees name the image ``image``. One model reads them all, and keeps the
fields it does not know in ``extra`` so nothing a user's dataset carries is lost.

Instances are read from a ``.jsonl``, ``.json`` (a list) or ``.parquet`` file, a directory a
``datasets`` ``save_to_disk`` wrote, a directory of ``<split>.parquet`` files (a Hub snapshot's
``data/<split>-00000-of-00001.parquet`` too), or a Hub dataset name (``owner/name``) already in
the local Hugging Face cache. Nothing here touches the network: an uncached name is an error
that says how to fetch it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from polar.config_loader import explain
from polar.errors import ConfigError

# Row locations ("file:line", "file row 3") paired with the raw record found there.
Records = Iterator[tuple[str, Any]]

_TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_TEXT_FIELDS = ("problem_statement", "patch", "test_patch", "hints_text")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# "test.parquet", "test.jsonl", and the Hub's sharded "test-00000-of-00001.parquet".
_SPLIT_FILE = re.compile(r"(?P<split>[A-Za-z0-9_.]+?)(-\d+-of-\d+)?\.(?P<ext>parquet|jsonl|json)")


class SWEInstance(BaseModel):
    """One SWE-bench-style instance, normalized: test lists are lists, absent text is ``""``."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1, description="owner/name, or swesmith/owner__name.sha.")
    base_commit: str | None = None
    problem_statement: str = ""
    patch: str = Field("", description="The gold patch (source files only).")
    test_patch: str = Field("", description="Tests added or changed to grade the fix.")
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str | None = None
    environment_setup_commit: str | None = None
    hints_text: str = ""
    image_name: str | None = Field(None, description="The instance's own image (SWE-smith).")
    test_cmd: str | None = Field(None, description="An explicit test command.")
    log_parser: str | None = Field(None, description="A swebench log parser's name.")
    eval_type: str | None = Field(None, description="pass_and_fail or fail_only.")
    source: str | None = Field(None, description="The file or dataset it was read from.")
    extra: dict[str, Any] = Field(default_factory=dict, description="Fields of other variants.")

    @model_validator(mode="before")
    @classmethod
    def _normalize(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data  # pydantic says what it expected
        record = dict(data)
        if "image" in record and "image_name" not in record:
            record["image_name"] = record.pop("image")
        extra = dict(record.pop("extra", None) or {})
        known: dict[str, Any] = {}
        for key, value in record.items():
            (known if key in cls.model_fields else extra)[key] = value
        for name in _TEXT_FIELDS:
            if known.get(name) is None:
                known.pop(name, None)
        for name in _TEST_LISTS:
            known[name] = _test_list(known.get(name), name)
        if isinstance(known.get("version"), int | float):
            known["version"] = str(known["version"])
        if isinstance(known.get("test_cmd"), list):
            known["test_cmd"] = " && ".join(str(c) for c in known["test_cmd"])
        known["extra"] = extra
        return known

    @property
    def variant(self) -> str:
        """Which dataset family it looks like: polar-bundled, swe-smith, swe-gym or swe-bench."""
        if self.repo.startswith("polar-bundled/"):
            return "polar-bundled"
        if self.repo.startswith("swesmith/") or "swesmith" in (self.image_name or ""):
            return "swe-smith"
        if "gym" in (self.source or "").lower():
            return "swe-gym"
        return "swe-bench"


def _test_list(value: Any, name: str) -> list[str]:
    """A list of test ids from a list or a JSON-encoded one (as the Hugging Face datasets ship)."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is a string but not a JSON list: {exc}") from None
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{name} must be a list of test ids (strings)")
    return list(value)


def load_instances(source: str | Path, split: str | None = None) -> list[SWEInstance]:
    """The instances in ``source`` (a file, a directory, or a cached Hub dataset name).

    ``split`` picks one split of a directory or dataset (default: ``test`` where there is one,
    else the only split); a single file is one split and ignores it. A malformed record or a
    repeated instance id is a ConfigError naming the file and line or row.
    """
    path = Path(source).expanduser()
    if path.is_file():
        records = _file_records(path)
        label = str(path)
    elif path.is_dir():
        records = _directory_records(path, split)
        label = str(path)
    elif isinstance(source, str) and _HUB_NAME.fullmatch(source):
        records = _hub_records(source, split)
        label = source
    else:
        raise ConfigError(f"no SWE instances at {source}: no such file or directory")
    return _validated(records, label)


def _validated(records: Records, label: str) -> list[SWEInstance]:
    instances: list[SWEInstance] = []
    seen: dict[str, str] = {}
    for where, record in records:
        if not isinstance(record, Mapping):
            kind = type(record).__name__
            raise ConfigError(f"{where}: expected an instance (an object), got {kind}")
        record = {"source": label, **record}
        try:
            instance = SWEInstance.model_validate(record)
        except ValidationError as exc:
            named = (
                f" ({record['instance_id']})" if isinstance(record.get("instance_id"), str) else ""
            )
            raise ConfigError(
                f"{where}: invalid SWE instance{named}:\n{explain(exc, SWEInstance)}"
            ) from None
        if instance.instance_id in seen:
            raise ConfigError(
                f"{where}: instance id {instance.instance_id!r} repeats the one at "
                f"{seen[instance.instance_id]}"
            )
        seen[instance.instance_id] = where
        instances.append(instance)
    return instances


# -- files ---------------------------------------------------------------------------------


def _file_records(path: Path) -> Records:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_records(path)
    if suffix == ".json":
        return _json_records(path)
    if suffix == ".parquet":
        return _parquet_records(path)
    raise ConfigError(f"cannot read SWE instances from {path}: expected .jsonl, .json or .parquet")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read SWE instances from {path}: {exc}") from exc


def _jsonl_records(path: Path) -> Records:
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not a JSON object: {exc}") from None
        yield f"{path}:{number}", record


def _json_records(path: Path) -> Records:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, list):
        kind = type(data).__name__
        raise ConfigError(f"{path}: expected a JSON list of instances, got {kind}")
    for index, record in enumerate(data):
        yield f"{path}[{index}]", record


def _parquet_records(path: Path) -> Records:
    from polar.extras import require

    require("parquet", "reading Parquet SWE instances")
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise ConfigError(f"cannot read SWE instances from {path}: {exc}") from exc
    for index, row in enumerate(rows, start=1):
        yield f"{path} row {index}", row


# -- directories: save_to_disk output, or one file (or shards) per split ----------------------


def _directory_records(path: Path, split: str | None) -> Records:
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return _saved_dataset_records(path, split)
    splits = _split_files(path)
    if not splits:
        raise ConfigError(
            f"no SWE instances in {path}: expected a datasets save_to_disk directory or "
            "<split>.parquet / <split>.jsonl files (or data/<split>-*.parquet)"
        )
    chosen = _choose_split(splits, split, where=str(path))
    return (item for file in splits[chosen] for item in _file_records(file))


def _split_files(path: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for folder in (path, path / "data"):
        if not folder.is_dir():
            continue
        for file in sorted(folder.iterdir()):
            match = _SPLIT_FILE.fullmatch(file.name)
            if match and file.is_file():
                found.setdefault(match["split"], []).append(file)
    return found


def _choose_split(available: Mapping[str, Any], split: str | None, *, where: str) -> str:
    names = ", ".join(sorted(available))
    if split is not None:
        if split not in available:
            raise ConfigError(f"{where} has no split {split!r} (splits: {names})")
        return split
    if "test" in available:
        return "test"
    if len(available) == 1:
        return next(iter(available))
    raise ConfigError(f"{where} has several splits ({names}): name one")


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        from polar.extras import MissingExtra

        raise MissingExtra(
            "swe", "reading a Hugging Face datasets directory", ["datasets"]
        ) from None
    return datasets


def _saved_dataset_records(path: Path, split: str | None) -> Records:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the saved dataset {path}: {exc}") from exc
    if isinstance(loaded, datasets.DatasetDict):
        chosen = _choose_split(loaded, split, where=str(path))
        loaded, where = loaded[chosen], f"{path} [{chosen}]"
    else:
        where = str(path)
    return ((f"{where} row {i}", row) for i, row in enumerate(loaded, start=1))


# -- Hugging Face Hub names, from the local cache only ---------------------------------------


def _hub_records(name: str, split: str | None) -> Records:
    snapshot = _hub_snapshot(name)
    if snapshot is not None and _split_files(snapshot):
        return _directory_records(snapshot, split)
    return _datasets_cache_records(name, split)


def hub_cache() -> Path:
    """Where ``huggingface_hub`` keeps downloaded repositories (its own resolution order)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _hub_snapshot(name: str) -> Path | None:
    """The cached snapshot of dataset ``name``: the one refs/main names, else the newest."""
    repo = hub_cache() / f"datasets--{name.replace('/', '--')}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def _datasets_cache_records(name: str, split: str | None) -> Records:
    not_cached = (
        f"no SWE instances at {name}: no such file or directory, and no Hugging Face dataset "
        f"of that name in the local cache ({hub_cache()}). Fetch it once where there is a "
        f"network (hf download {name} --repo-type dataset), or pass a file"
    )
    try:
        datasets = _datasets()
    except ConfigError:
        raise ConfigError(not_cached) from None
    try:
        with _hub_offline():
            loaded = datasets.load_dataset(name)
    except Exception as exc:  # datasets raises many kinds for "not there"
        raise ConfigError(f"{not_cached} ({type(exc).__name__}: {exc})") from None
    chosen = _choose_split(loaded, split, where=name)
    return ((f"{name} [{chosen}] row {i}", row) for i, row in enumerate(loaded[chosen], start=1))


@contextmanager
def _hub_offline() -> Iterator[None]:
    """``datasets`` and ``huggingface_hub`` in offline mode, whatever the environment says."""
    import datasets.config
    import huggingface_hub.constants as hub

    saved = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved
