"""Loaders for the file tasks: gsm8k, mawps, svamp, mc, math (docs/design.md §9).

Every loader reads records through read_records (JSONL, JSON list or CSV, by file extension) and
raises DataError naming the file and line for anything malformed: a missing file, a bad JSON line, a
missing or empty field, a file with no examples. Nothing is skipped silently; the one deliberate
filter, mawps rows whose equation does not reproduce their answer, is counted in load_stats["mawps"]
and logged.
"""

import csv
import io
import json
import logging
import math
import re
from collections import Counter
from pathlib import Path

from .answers import LETTERS, _close, last_boxed, normalize_number
from .example import DataError, Example

log = logging.getLogger(__name__)
load_stats: dict = {}  # task -> counts from its last load (mawps: rows, kept, dropped, reasons)


# --------------------------------------------------------------------------------------------------
# records


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise DataError(f"{path}: file not found" if not path.exists() else f"{path}: not a file")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")  # -sig: tolerate the byte-order mark spreadsheet exports add
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not valid UTF-8") from None


def read_records(path) -> list[tuple[int, dict]]:
    """(line number, record with lower-cased keys) for every record of a .jsonl, .json (a list) or
    .csv file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".csv"):
        raise DataError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; expected .jsonl, .json or .csv"
        )
    text = _read_text(path)
    if suffix == ".jsonl":
        records = _jsonl(path, text)
    elif suffix == ".json":
        records = _json_list(path, text)
    else:
        records = _csv(path, text)
    if not records:
        raise DataError(f"{path}: no examples (empty file?)")
    return records


def _lower_keys(path, line, obj) -> dict:
    if not isinstance(obj, dict):
        raise DataError(f"{path}:{line}: expected a JSON object, got {type(obj).__name__}")
    return {str(k).strip().lower(): v for k, v in obj.items()}


def _jsonl(path, text) -> list:
    out = []
    # split("\n"), not splitlines(): JSON may hold U+2028
    for line, s in enumerate(text.split("\n"), 1):
        if not s.strip():
            continue
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}:{line}: malformed JSON ({e.msg} at column {e.colno})"
            ) from None
        out.append((line, _lower_keys(path, line, obj)))
    return out


def _json_list(path, text) -> list:
    """A JSON array of objects, decoded one element at a time so each record knows its line
    number."""
    decoder, out = json.JSONDecoder(), []
    ws = re.compile(r"[ \t\r\n]*")

    def fail(pos, msg):
        raise DataError(f"{path}:{text.count(chr(10), 0, pos) + 1}: {msg}") from None

    pos = ws.match(text, 0).end()
    if pos == len(text):
        return out
    if text[pos] != "[":
        fail(pos, "expected a JSON list of objects")
    pos = ws.match(text, pos + 1).end()
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            try:
                obj, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                fail(e.pos, f"malformed JSON ({e.msg})")
            line = text.count("\n", 0, pos) + 1
            out.append((line, _lower_keys(path, line, obj)))
            pos = ws.match(text, end).end()
            if text.startswith("]", pos):
                pos += 1
                break
            if not text.startswith(",", pos):
                fail(pos, "malformed JSON (expected ',' or ']')")
            pos = ws.match(text, pos + 1).end()
    if ws.match(text, pos).end() != len(text):
        fail(pos, "malformed JSON (extra data after the list)")
    return out


def _csv(path, text) -> list:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return []
        keys = [h.strip().lower() for h in header]
        # a quoted field may span lines: number each record by its first
        out, start = ([], reader.line_num + 1)
        for row in reader:
            if any(cell.strip() for cell in row):
                if len(row) > len(keys):
                    raise DataError(
                        f"{path}:{start}: {len(row)} fields but the header has {len(keys)}"
                    )
                out.append((start, dict(zip(keys, row))))
            start = reader.line_num + 1
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
    return out


def _field(path, line, rec, key, *, text=True):
    """rec[key], required: a non-empty string when text=True, else any non-empty value."""
    if key not in rec or rec[key] is None:
        raise DataError(
            f"{path}:{line}: missing field {key!r} (have: {', '.join(sorted(rec)) or 'none'})"
        )
    value = rec[key]
    if text:
        if not isinstance(value, str):
            raise DataError(
                f"{path}:{line}: field {key!r} should be text, got {type(value).__name__}"
            )
        value = value.strip()
    if value == "" or value == []:
        raise DataError(f"{path}:{line}: field {key!r} is empty")
    return value


def _fmt(x: float) -> str:
    """A number as a person writes it: 56.0 -> "56", 2.5 -> "2.5", 0.3333 -> "0.3333"."""
    if float(x).is_integer():
        return str(int(x))
    s = repr(float(x))
    return s if "e" not in s else f"{x:.12f}".rstrip("0").rstrip(".")


def _gold_number(path, line, value, key) -> str:
    """A numeric gold answer (number or numeric string) as canonical text."""
    x = normalize_number(value)
    if x is None:
        raise DataError(f"{path}:{line}: field {key!r} is not a number: {value!r}")
    return _fmt(x)


def _ex(task, path, line, question, answer, choices=None, **meta) -> Example:
    return Example(
        question=question,
        answer=answer,
        task=task,
        choices=choices,
        id=f"{task}/{Path(path).stem}/{line}",
        meta={"source": str(path), "line": line, **meta},
    )


# --------------------------------------------------------------------------------------------------
# tasks


def load_gsm8k(path) -> list[Example]:
    """GSM8K JSONL: question, answer = rationale ending in "#### n". Gold: n without commas."""
    out = []
    for line, rec in read_records(path):
        question, solution = _field(path, line, rec, "question"), _field(path, line, rec, "answer")
        if "####" not in solution:
            raise DataError(f"{path}:{line}: field 'answer' has no '#### <number>' final line")
        rationale, _, final = solution.rpartition("####")
        gold = final.strip().replace(",", "").rstrip(".")
        if normalize_number(gold) is None:
            raise DataError(
                f"{path}:{line}: the number after '####' is not a number: {final.strip()!r}"
            )
        out.append(_ex("gsm8k", path, line, question, gold, solution=rationale.strip()))
    return out


def load_svamp(path) -> list[Example]:
    """SVAMP JSON list (or JSONL) of {Body, Question, Answer}; the question is Body + " " +
    Question."""
    out = []
    for line, rec in read_records(path):
        body, ques = _field(path, line, rec, "body"), _field(path, line, rec, "question")
        gold = _gold_number(path, line, _field(path, line, rec, "answer", text=False), "answer")
        extra = {k: rec[k] for k in ("id", "equation", "type") if k in rec}
        out.append(_ex("svamp", path, line, f"{body} {ques}", gold, **extra))
    return out


def load_mc(path) -> list[Example]:
    """Multiple choice, JSONL or CSV: question; options as columns A, B, C, D or a "choices" list of
    four; answer as a letter ("B", "(b)") or a 0-based index."""
    out = []
    for line, rec in read_records(path):
        question = _field(path, line, rec, "question")
        if "choices" in rec:
            choices = rec["choices"]
            if not isinstance(choices, list) or len(choices) != 4:
                raise DataError(f"{path}:{line}: field 'choices' should be a list of 4 options")
            choices = [str(c).strip() for c in choices]
        else:
            choices = [str(_field(path, line, rec, k, text=False)).strip() for k in "abcd"]
        if any(not c for c in choices):
            raise DataError(f"{path}:{line}: an option is empty")
        raw = _field(path, line, rec, "answer", text=False)
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 4:
            gold = LETTERS[raw]
        else:
            gold = str(raw).strip().strip("()").strip().upper()
            if gold.isdigit() and int(gold) < 4:
                gold = LETTERS[int(gold)]
        if gold not in LETTERS:
            raise DataError(
                f"{path}:{line}: answer should be a letter A-D or an index 0-3, got {raw!r}"
            )
        out.append(_ex("mc", path, line, question, gold, choices=choices))
    return out


def load_math(path) -> list[Example]:
    """MATH-style JSONL: problem, solution with \\boxed{}; gold = the last boxed content (or field
    "answer")."""
    out = []
    for line, rec in read_records(path):
        problem, solution = _field(path, line, rec, "problem"), _field(path, line, rec, "solution")
        gold = last_boxed(solution)
        if gold is None or not gold.strip():
            if rec.get("answer") is None or not str(rec["answer"]).strip():
                raise DataError(f"{path}:{line}: the solution has no \\boxed{{...}} answer")
            gold = str(rec["answer"])
        extra = {k: rec[k] for k in ("level", "type", "subject") if k in rec}
        out.append(_ex("math", path, line, problem, gold.strip(), solution=solution, **extra))
    return out


_PLACEHOLDER = re.compile(r"number(\d+)")
_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


def _eval_prefix(equation: str, numbers: list[float]) -> float:
    """Value of a prefix equation like "- number0 * number1 number2" (raises on anything
    malformed)."""
    stack = []
    # right to left: operands are on the stack when an operator comes
    for tok in reversed(equation.split()):
        if tok in _OPS:
            a, b = stack.pop(), stack.pop()
            stack.append(_OPS[tok](a, b))
        elif _PLACEHOLDER.fullmatch(tok):
            stack.append(numbers[int(tok[6:])])
        else:
            stack.append(float(tok))
    if len(stack) != 1:
        raise ValueError("operands left over")
    return stack[0]


def _detokenize(s: str) -> str:
    """Undo the dataset's tokenization: "books ." -> "books.", "$ 5" -> "$5", "Bryan 's" ->
    "Bryan's"."""
    s = re.sub(r" ([.,?!;:%)])", r"\1", s)
    s = re.sub(r"([$(]) ", r"\1", s)
    return re.sub(r" (n't|'s|'ve|'re|'ll|'d|'m)\b", r"\1", s)


def load_mawps(path) -> list[Example]:
    """MAWPS/ASDiv-A CSV (Question, Numbers, Equation, Answer): number0.. placeholders filled from
    Numbers.

    A row is kept only when its prefix Equation, evaluated on the numbers its question states,
    reproduces its Answer (the tolerance is is_correct's). The rest (a rounded answer, a placeholder
    or equation index with no number, a malformed equation) are dropped, counted in
    load_stats["mawps"] and logged.
    """
    records, out, reasons = read_records(path), [], Counter()
    for line, rec in records:
        question = _field(path, line, rec, "question")
        numbers_text = str(rec.get("numbers") or "")
        equation, answer = _field(path, line, rec, "equation"), _field(path, line, rec, "answer")
        try:
            numbers = [float(t) for t in numbers_text.split()]
        except ValueError:
            reasons["bad Numbers"] += 1
            continue
        asked = {int(i) for i in _PLACEHOLDER.findall(question)}
        used = {int(i) for i in _PLACEHOLDER.findall(equation)}
        if any(i >= len(numbers) for i in asked) or not used <= asked:
            reasons["placeholder without a number"] += 1
            continue
        gold = normalize_number(answer)
        if gold is None:
            reasons["answer not a number"] += 1
            continue
        try:
            value = _eval_prefix(equation, numbers)
        except (ValueError, IndexError, ZeroDivisionError, OverflowError):
            reasons["malformed equation"] += 1
            continue
        if not (math.isfinite(value) and _close(value, gold)):
            reasons["equation does not give the answer"] += 1
            continue
        text = _detokenize(_PLACEHOLDER.sub(lambda m: _fmt(numbers[int(m.group(1))]), question))
        out.append(_ex("mawps", path, line, text, _fmt(gold), equation=equation, numbers=numbers))
    dropped = sum(reasons.values())
    load_stats["mawps"] = {
        "rows": len(records),
        "kept": len(out),
        "dropped": dropped,
        "reasons": dict(reasons),
    }
    if dropped:
        log.warning(
            "mawps %s: kept %d of %d rows, dropped %d (%s)",
            path,
            len(out),
            len(records),
            dropped,
            ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())),
        )
    if not out:
        raise DataError(f"{path}: no usable rows (all {len(records)} dropped: {dict(reasons)})")
    return out


FILE_TASKS = {
    "gsm8k": load_gsm8k,
    "mawps": load_mawps,
    "svamp": load_svamp,
    "mc": load_mc,
    "math": load_math,
}
