"""The records --data and --eval-data name, read and checked once, the same way for the planner and the trainer
(issue 29): `plan`, `--dry-run`, `--plain` and the wizard refuse exactly what the trainer would, in its own words.

Torch-free and library-free: JSONL and JSON lines line by line (each error names the file and line), a JSON array
read whole (bounded), CSV with the csv module (quotes checked strictly, fields of any size, pandas' typing: a
column whose every value is a number is numbers, an empty cell is null), Parquet through pyarrow. A FIFO or device
is one line (engine/fileio.open_regular). trainer/data.py and trainer/objective_run.py read through here.

Accepted record shapes for a supervised (sft) run:
  {"text": "..."}  ·  {"prompt": "...", "completion": "..."} ("response" for "completion")  ·
  {"messages": [{"role": "...", "content": "..."}, ...]}
Reward and DPO rows need "chosen" and "rejected", GRPO rows a "prompt".
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Iterator

from scaletrain.engine.errors import ScaletrainError
from scaletrain.engine.fileio import MAX_DATA_BYTES, open_regular, read_text_bounded

RECORD_SHAPES = '"text", "prompt"+"completion" (or "response"), or "messages" (a list of {"role", "content"})'
CHAT_ROLES = ("system", "user", "assistant", "tool")
MAX_DEPTH = 32               # nesting of one record's values (a chat turn is 3 deep): deeper is not a record
MAX_LINE_BYTES = 256 << 20   # one JSONL line
COLUMNS_HINT = "map other column names with --data-columns, e.g. prompt=question,completion=answer"
Located = list[tuple[str, dict[str, Any]]]


def _fail(msg: str) -> ScaletrainError:
    return ScaletrainError(msg)


def _depth_ok(v: Any, left: int = MAX_DEPTH) -> bool:
    if left < 0:
        return False
    if isinstance(v, dict):
        return all(_depth_ok(x, left - 1) for x in v.values())
    if isinstance(v, list):
        return all(_depth_ok(x, left - 1) for x in v)
    return True


def _record(obj: Any, where: str, shapes: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        kind = "an array" if isinstance(obj, list) else "null" if obj is None else f"a {type(obj).__name__}"
        raise _fail(f"{where}: {kind}; a JSON object is needed, with {shapes}")
    if not _depth_ok(obj):
        raise _fail(f"{where}: nested more than {MAX_DEPTH} levels deep; a record holds {shapes}")
    return obj


def _loads(text: str, where: str, shapes: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(f"{where}: not valid JSON ({e.msg}); each line must be one object with {shapes}") from None
    except RecursionError:
        raise _fail(f"{where}: nested too deeply to read; a record holds {shapes}") from None


def _open(path: Path) -> Any:
    try:
        return open_regular(path, "dataset")
    except FileNotFoundError:
        raise _fail(f"dataset {path} does not exist (give a data file with {RECORD_SHAPES} per record)") from None
    except OSError as e:
        raise _fail(f"dataset {path} cannot be read ({e.strerror or e.__class__.__name__})") from None


def _json_lines(path: Path, shapes: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with _open(path) as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            where = f"{path}:{lineno}"
            if len(raw) > MAX_LINE_BYTES:
                raise _fail(f"{where}: a line of more than {MAX_LINE_BYTES >> 20} MiB; one record per line")
            if b"\x00" in raw:
                raise _fail(f"{where}: holds NUL bytes (a binary file?); give UTF-8 text, one JSON object per line")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _fail(f"{where}: not UTF-8 text; give UTF-8 JSON lines") from None
            if line.strip():
                yield where, _record(_loads(line, where, shapes), where, shapes)


def _first_char(path: Path) -> str:
    with _open(path) as f:
        head = f.read(4096).lstrip()
    return head[:1].decode("latin-1")


def _json_file(path: Path, shapes: str) -> Located:
    """A .json file: one array of records, or JSON lines (a single object spanning lines is said to be one)."""
    if _first_char(path) != "[":
        try:
            return list(_json_lines(path, shapes))
        except ScaletrainError:
            if _first_char(path) == "{" and _whole_object(path):
                raise _fail(f"dataset {path} is one JSON object, not records; give a JSON array of records or one "
                            f"object per line, each with {shapes}") from None
            raise
    try:
        text = read_text_bounded(path, MAX_DATA_BYTES, "dataset")
    except UnicodeDecodeError:
        raise _fail(f"dataset {path} is not UTF-8 text") from None
    if "\x00" in text:
        raise _fail(f"dataset {path} holds NUL bytes (a binary file?); give UTF-8 JSON")
    data = _loads(text, str(path), shapes)
    if not isinstance(data, list):
        raise _fail(f"dataset {path} is not a JSON array of records")
    return [(f"{path} record {i}", _record(r, f"{path} record {i}", shapes)) for i, r in enumerate(data)]


def _whole_object(path: Path) -> bool:
    try:
        return isinstance(json.loads(read_text_bounded(path, MAX_DATA_BYTES, "dataset")), dict)
    except (ValueError, RecursionError, ScaletrainError, OSError):
        return False


def _csv_value(cells: list[str]) -> list[Any]:
    """pandas' reading of one column: all numbers → numbers (int when every one is whole), "" → null."""
    filled = [c for c in cells if c != ""]
    for kind in (int, float):
        try:
            it = iter([kind(c) for c in filled])
        except ValueError:
            continue
        return [None if c == "" else next(it) for c in cells]
    return [None if c == "" else c for c in cells]


def _csv_file(path: Path, shapes: str) -> Located:
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_DATA_BYTES:
            raise _fail(f"dataset {path} is {size:,} bytes, more than the {MAX_DATA_BYTES:,} read at once")
        raw = f.read()
    if b"\x00" in raw:
        raise _fail(f"dataset {path} holds NUL bytes (a binary file?); give UTF-8 CSV")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _fail(f"dataset {path} is not UTF-8 text") from None
    old = csv.field_size_limit()
    csv.field_size_limit(max(old, MAX_DATA_BYTES))        # a long text field is data, not an attack
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        rows = [r for r in reader if r]
    except csv.Error as e:
        raise _fail(f"dataset {path}: not valid CSV near line {reader.line_num} ({e}); quote fields holding commas, "
                    "quotes or line breaks") from None
    finally:
        csv.field_size_limit(old)
    if len(rows) < 2:
        raise _fail(f"dataset {path} holds no records (a header line, then one record per line)")
    head = [h.strip() for h in rows[0]]
    if len(set(head)) != len(head) or not all(head):
        raise _fail(f"dataset {path}: the header needs distinct, non-empty column names (got {', '.join(head)[:200]})")
    for i, r in enumerate(rows[1:], 1):
        if len(r) != len(head):
            raise _fail(f"dataset {path} row {i}: {len(r)} fields where the header names {len(head)}")
    cols = [_csv_value([r[j] for r in rows[1:]]) for j in range(len(head))]
    return [(f"{path} row {i}", {h: cols[j][i] for j, h in enumerate(head)}) for i in range(len(rows) - 1)]


def _parquet_file(path: Path, shapes: str) -> Located:
    with _open(path):                       # a FIFO or device is refused before pyarrow opens it
        pass
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    except Exception as e:                   # pyarrow's own errors: not a Parquet file, a broken one
        why = str(e).splitlines()[0][:160] if str(e).strip() else e.__class__.__name__
        raise _fail(f"dataset {path} cannot be read as Parquet ({why})") from None
    return [(f"{path} row {i}", _record(r, f"{path} row {i}", shapes)) for i, r in enumerate(rows)]


def located_records(spec: str | Path, shapes: str = RECORD_SHAPES) -> Located:
    """(where, record) for everything --data names (a file, a folder, a cached HF dataset: data_source.resolve_data),
    each a JSON object; unchecked against any objective. One line naming the file and line or row on any problem."""
    from scaletrain.engine.request.data_source import resolve_data

    src = resolve_data(str(spec))
    out: Located = []
    for f in src.files:
        if f.suffix == ".jsonl":
            out += list(_json_lines(f, shapes))
        elif f.suffix == ".json":
            out += _json_file(f, shapes)
        elif f.suffix == ".csv":
            out += _csv_file(f, shapes)
        else:
            out += _parquet_file(f, shapes)
    if not out:
        raise _fail(f"dataset {src.spec} holds no records (each with {shapes})")
    return out


# ---- what each objective needs of a record ----------------------------------------------------------------------
def _short(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def _completion(rec: dict[str, Any]) -> Any:
    return rec["completion"] if rec.get("completion") is not None else rec.get("response")


def _messages_ok(msgs: Any) -> bool:
    return isinstance(msgs, list) and bool(msgs) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") in CHAT_ROLES for m in msgs)


def record_shape(rec: dict[str, Any], where: str) -> str:
    """Which supervised shape a record is ("text", "messages" or "prompt"), or one line saying what is wrong."""
    if isinstance(rec.get("text"), str):
        return "text"
    if _messages_ok(rec.get("messages")):
        return "messages"
    if isinstance(rec.get("prompt"), str) and isinstance(_completion(rec), str):
        return "prompt"
    raise _fail(f"{where}: {_what_is_wrong(rec)}")


def _what_is_wrong(rec: dict[str, Any]) -> str:
    if "text" in rec:
        return f'"text" is {_short(rec["text"])}, not a string; accepted: {RECORD_SHAPES}'
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            return f'"messages" is {_short(msgs)}; it must be a non-empty list of {{"role", "content"}} turns'
        i = next(i for i, m in enumerate(msgs) if not (isinstance(m, dict) and isinstance(m.get("content"), str)
                                                        and m.get("role") in CHAT_ROLES))
        return (f'messages[{i}] must be {{"role": one of {", ".join(CHAT_ROLES)}, "content": text}} '
                f'(got {_short(msgs[i])})')
    if "prompt" in rec and ("completion" in rec or "response" in rec):
        bad = "prompt" if not isinstance(rec.get("prompt"), str) else "completion"
        return f'"{bad}" is {_short(rec.get(bad) if bad in rec else rec.get("response"))}, not a string'
    if "chosen" in rec and "rejected" in rec:
        return ("a preference pair (chosen/rejected): data for --objective dpo or reward, not a supervised (sft) "
                f"run; an sft record holds {RECORD_SHAPES}")
    return (f"no usable fields (found {', '.join(sorted(map(str, rec)))[:120] or 'none'}); accepted: {RECORD_SHAPES}; "
            f"{COLUMNS_HINT}")


def with_columns(rec: dict[str, Any], columns: dict[str, str] | None, where: str = "") -> dict[str, Any]:
    """A record with its columns renamed to TRL's names (`--data-columns prompt=question,completion=answer`); a
    mapped column the record lacks is one line (naming `where`)."""
    if not columns:
        return rec
    out = dict(rec)
    for ours, theirs in columns.items():
        if theirs in rec:
            if ours not in rec or ours == theirs:
                out[ours] = out.pop(theirs)
        elif ours not in rec:
            raise _fail(f"{where or 'a record'}: --data-columns maps {ours} to column {theirs!r}, which the data "
                        f"lacks (its columns: {', '.join(sorted(map(str, rec)))[:160] or 'none'})")
    return out


OBJECTIVE_NEEDS = {"grpo": ("prompt",), "dpo": ("chosen", "rejected"), "reward": ("chosen", "rejected")}


def objective_rows(spec: str | Path, objective: str) -> list[dict[str, Any]]:
    """The rows a reward, DPO or GRPO run trains on: each holds the columns the objective needs, as text or a
    conversation (a list), one line naming the line or row otherwise."""
    need = OBJECTIVE_NEEDS[objective]
    shapes = " and ".join(f'"{k}"' for k in need)
    rows = []
    for where, row in located_records(spec, shapes):
        missing = [k for k in need if k not in row]
        if missing:
            raise _fail(f"{where} lacks {', '.join(missing)} ({objective} rows need {' and '.join(need)})")
        bad = next((k for k in need if not isinstance(row[k], (str, list))), None)
        if bad:
            raise _fail(f"{where}: {bad!r} is {_short(row[bad])}; {objective} rows need text (or a conversation)")
        rows.append(row)
    return rows


def sft_records(spec: str | Path, columns: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every record of a supervised run (columns renamed), each checked for one of the accepted shapes."""
    records = []
    for where, rec in located_records(spec):
        rec = with_columns(rec, columns, where)
        record_shape(rec, where)
        records.append(rec)
    return records


def no_blocks(spec: str | Path, seq_len: int, packing: bool) -> str:
    """The trainer's line for data that makes no block of seq_len tokens (`plan` says the same from the profile)."""
    how = "use padding (packing off) or a shorter --seq-len" if packing else "check the records"
    return f"dataset {spec} yields no training block of {seq_len} tokens; {how}"


_CHECKED: dict[str, int] = {}


def check_data(spec: str, objective: str = "sft", columns: dict[str, str] | None = None) -> int:
    """--data or --eval-data read and checked exactly as the trainer will for this objective (the trainer's own
    line on any problem); the number of records. Remembered by the files' sizes and times (the wizard asks
    again as fields change)."""
    from scaletrain.engine.request.data_source import resolve_data

    src = resolve_data(spec)
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in src.files]
    key = json.dumps([stats, objective, columns], sort_keys=True)
    if key not in _CHECKED:
        rows = objective_rows(spec, objective) if objective in OBJECTIVE_NEEDS else sft_records(spec, columns)
        _CHECKED[key] = len(rows)
    return _CHECKED[key]
