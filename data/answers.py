"""Answer extraction and comparison (docs/design.md §2, §9).

Two readers of a completion's answer, named apart. The game's majority vote, the evaluation and
every report read leniently; a training reward reads strictly, so that no text the prompt did not
ask for earns a reward by accident (a model under RL finds such texts: repeating numbers until the
token cap ends it, or hedging over several answer lines):

    pred = extract_answer(completion, task)   # lenient: a canonical string, or None
    pred = strict_answer(completion, task)    # strict: the one `Answer:` field, or None
    ok = is_correct(pred, gold, task)         # numeric / letter / LaTeX-string comparison

Numbers are read exactly (fractions.Fraction) and returned in one canonical form ("1,234.50" ->
"1234.5", "6/8" -> "0.75", "1/3" stays "1/3"), so equal values give equal strings and a vote can
count strings. Every regex here is linear in the text (no nested or adjacent overlapping
quantifiers): completions are untrusted and can be long.
"""

import math
import re
from fractions import Fraction

REL_TOL = 1e-6  # numeric answers match when they agree to ~6 significant digits
ABS_TOL = 1e-9  # ... or are both (almost) zero

NUMERIC_TASKS = (
    "arith",
    "arith1",
    "arith2",
    "arith3",
    "arith4",
    "split",
    "gsm8k",
    "mawps",
    "svamp",
)
ANSWER_TASKS = NUMERIC_TASKS + ("mc", "math")
LETTERS = "ABCD"


def answer_kind(task: str) -> str:
    """ "number", "mc" or "math": how a task's answers are extracted and compared."""
    if task in NUMERIC_TASKS:
        return "number"
    if task in ("mc", "math"):
        return task
    raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(ANSWER_TASKS)}")


# --------------------------------------------------------------------------------------------------
# numbers

# One number token: thousands groups "1,234,567" or plain digits, optional decimals, optional short
# exponent, optional "/denominator". A token glued to a preceding letter, digit or dot ("mp3",
# "H2O", the "5" of "3.5") is not a number; a leading "-" counts only when it is not glued to a word
# either ("10-5" is 10 and 5).
_UNSIGNED = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+"
_TOKEN = rf"(?:{_UNSIGNED})(?:[eE][+-]?[0-9]{{1,3}})?(?:[ \t]*/[ \t]*(?:{_UNSIGNED}))?"
_NUM_RE = re.compile(rf"(?<![\w.])-?{_TOKEN}")
_NUM_AT = re.compile(_TOKEN)  # anchored use (match) in _parse
_MAX_TOKEN = 64  # longer digit strings are garbage, and int() of huge strings is slow or refused

# LaTeX that wraps a number: \frac{3}{4} -> 3/4, \text{ apples} -> " apples" (a unit), \$ -> $, ...
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*(-?[0-9.,]+)\s*\}\s*\{\s*(-?[0-9.,]+)\s*\}")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_LATEX_NOISE = re.compile(r"\\[,;:! ]|\\left|\\right|\^\s*\{?\\circ\}?|\\circ")
_NAN_INF = {"nan", "inf", "infinity"}


def _delatex(s: str, keep_text: bool = True) -> str:
    """Turn the LaTeX around a number into plain text (a linear pass of small substitutions)."""
    # -$5 is -5
    s = s.replace("\u2212", "-").replace("\\$", "$").replace("\\%", "%").replace("-$", "-")
    s = _FRAC_RE.sub(r"\1/\2", s)
    s = _TEXT_RE.sub(r" \1" if keep_text else "", s)
    return _LATEX_NOISE.sub("", s)


def _token_value(tok: str) -> Fraction | None:
    """Exact value of a number token matched by _TOKEN (commas, decimals, exponent, a/b); None if
    invalid."""
    if len(tok) > _MAX_TOKEN:
        return None
    num, _, den = tok.replace(",", "").replace(" ", "").replace("\t", "").partition("/")
    try:
        value = Fraction(num)
        if den:
            d = Fraction(den)
            if d == 0:
                return None
            value /= d
    except (ValueError, ZeroDivisionError):
        return None
    try:  # anything a float cannot hold (1e999) is no answer
        if not math.isfinite(float(value)):
            return None
    except OverflowError:
        return None
    return value


def _parse(s, units: bool = True) -> Fraction | None:
    """Exact value of a string that is one number, or None.

    Accepts a sign, a currency sign ($ € £ ¥), thousands commas, decimals, "a/b", \\frac{a}{b} and a
    trailing "." or "%". With units=True anything after the number that holds no digit is a unit and
    ignored ("12 apples", "5 km", "50%"); with units=False (task "math", where "2x" is not 2) only
    LaTeX \\text{} units are.
    """
    if s is None or isinstance(s, bool):
        return None
    if isinstance(s, (int, float)):
        return Fraction(s) if math.isfinite(s) else None
    if not isinstance(s, str):
        return None
    s = _delatex(s, keep_text=units).strip().strip("$").strip()
    sign = 1
    if s[:1] in ("-", "+"):
        sign = -1 if s[0] == "-" else 1
        s = s[1:].lstrip()
    if s[:1] in ("$", "€", "£", "¥"):
        s = s[1:].lstrip()
        if s[:1] in ("-", "+") and sign == 1:  # "$-5"
            sign = -1 if s[0] == "-" else 1
            s = s[1:].lstrip()
    m = _NUM_AT.match(s)
    if not m:
        return None
    rest = s[m.end() :]
    if re.search(r"[0-9]", rest):  # "12 + 3", "1,23", "3\sqrt{2}": not one number
        return None
    if not units and rest.strip() not in ("", ".", "%"):
        return None
    value = _token_value(m.group())
    return None if value is None else sign * value


def normalize_number(s) -> float | None:
    """The value of a numeric answer string as a finite float, or None.

    "$1,234.50" -> 1234.5, "12 apples" -> 12.0, "007" -> 7.0, "-3" -> -3.0, "3/4" -> 0.75, "50%" ->
    50.0, "12." -> 12.0; "", "nan", "inf", "abc", "12 + 3" -> None.
    """
    value = _parse(s, units=True)
    return None if value is None else float(value)


def _canon(value: Fraction) -> str:
    """Canonical text of an exact value: "12", "-0.75", "1234.5", or "1/3" when no finite decimal
    exists."""
    num, den = value.numerator, value.denominator
    if den == 1:
        return str(num)
    twos = fives = 0
    d = den
    while d % 2 == 0:
        d //= 2
        twos += 1
    while d % 5 == 0:
        d //= 5
        fives += 1
    if d != 1:
        return f"{num}/{den}"
    k = max(twos, fives)
    digits = str(abs(num) * 10**k // den).rjust(k + 1, "0")
    return ("-" if num < 0 else "") + digits[:-k] + "." + digits[-k:]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _same(p: Fraction, g: Fraction) -> bool:
    """Equal values. Two integers must match exactly (1000000 is not 1000001); otherwise within
    REL_TOL, so a rounded decimal ("0.833333") matches a fraction ("5/6")."""
    if p == g:
        return True
    if p.denominator == 1 and g.denominator == 1:
        return False
    return _close(float(p), float(g))


# --------------------------------------------------------------------------------------------------
# pieces of a completion

# "Answer:", "**Answer:**", "Final answer:"
_ANSWER_RE = re.compile(r"\banswer\b[ \t*_]*[:：]", re.I)
_ANSWER_IS_RE = re.compile(r"\banswer\s+is\b[ \t*_:]*", re.I)  # "the (final/correct) answer is"
_BOXED_RE = re.compile(r"\\boxed\s*\{")
# Trailer fields whose numbers are not the answer: "Steps: 3", "Confidence: 8/10",
# "confidence (1-10): 80%", "Confidence: .9".
_TRAILER_FIELD_RE = re.compile(
    r"\b(?:steps?|confidence)\b[ \t*_]*(?:\([^()\n]{0,30}\)[ \t*_]*)?[:=][ \t*_]*"
    r"(?:(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[ \t]*(?:/|out of)[ \t]*[0-9]+)?[ \t]*%?)?",
    re.I,
)


def _values_after(regex, text: str):
    """For each match of regex, last first: the text after it up to the end of its line (or the next
    match).

    Cutting at the next match keeps the total work linear even for a line holding thousands of
    matches.
    """
    matches = list(regex.finditer(text))
    for i in range(len(matches) - 1, -1, -1):
        start = matches[i].end()
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if i + 1 < len(matches):
            end = min(end, matches[i + 1].start())
        yield text[start:end]


def last_boxed(text: str) -> str | None:
    """Content of the last closed \\boxed{...} (nested braces allowed), or None. One pass over the
    braces."""
    opens = [m.end() - 1 for m in _BOXED_RE.finditer(text)]  # index of each boxed "{"
    if not opens:
        return None
    closing, stack = {}, []
    for m in re.finditer(r"[{}]", text[opens[0] :]):
        i = opens[0] + m.start()
        if m.group() == "{":
            stack.append(i)
        elif stack:
            closing[stack.pop()] = i
    for i in reversed(opens):
        if i in closing:
            return text[i + 1 : closing[i]]
    return None


def _number_in(span: str) -> str | None:
    """Canonical number stated in a short answer span ("$1,234.50", "72 apples", "48 + 24 = 72",
    "\\boxed{3}")."""
    boxed = last_boxed(span)
    if boxed is not None:
        span = boxed
    span = _delatex(span)
    if "=" in span:  # "48 + 24 = 72": the result is after the last "="
        span = span.rsplit("=", 1)[1]
    m = _NUM_RE.search(span)
    return _canon_token(m.group()) if m else None


def _canon_token(tok: str) -> str | None:
    neg = tok.startswith("-")
    value = _token_value(tok[1:] if neg else tok)
    return None if value is None else _canon(-value if neg else value)


_LETTER_WHOLE = re.compile(r"\(?([A-Da-d])\)?[.:,)]?")  # "B", "(b)", "c.", "D)"
_LETTER_PAREN = re.compile(r"\(([A-Da-d])\)")  # "... (B) 42"
_LETTER_OPTION = re.compile(r"\b(?:option|choice)\s*\(?([A-Da-d])\b", re.I)  # "option c"
_LETTER_ANY = re.compile(r"(?<![A-Za-z'])([A-D])(?![A-Za-z'])")  # "B) 42", "I think C"
# Fallback over a whole completion: "(B)", "B)", "option B", or a line that is just a letter.
_LETTER_LAST = re.compile(
    r"\(([A-Da-d])\)|(?<![A-Za-z(])([A-D])\)|(?i:\b(?:option|choice)\s+\(?([A-D])\b)|^[ "
    r"\t*]*([A-D])[ \t.*]*$",
    re.M,
)


def _letter_in(span: str) -> str | None:
    """Option letter A-D stated in a short answer span, upper-cased. A lone lowercase letter counts
    only when it is the whole span ("b", "(b)"), so "Answer: a dog" is not option A."""
    span = _TEXT_RE.sub(r"\1", span).strip().strip("*_`$ \t").strip()
    m = _LETTER_WHOLE.fullmatch(span)
    if m is None:
        m = _LETTER_PAREN.search(span) or _LETTER_OPTION.search(span) or _LETTER_ANY.search(span)
    return m.group(1).upper() if m else None


def _math_key(s: str) -> str:
    """A LaTeX answer with the no-op differences removed: whitespace, $ delimiters, \\left/\\right,
    \\dfrac."""
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\left|\\right|\\[,;:! ]", "", s)
    s = re.sub(r"\s+", "", s)
    return s.strip("$").rstrip(".")


# --------------------------------------------------------------------------------------------------
# the two public functions


def extract_answer(text: str | None, task: str) -> str | None:
    """The final answer of a completion, or None when none can be read.

    Numeric tasks, in order: the last "Answer: <value>" trailer that holds a number; the last
    \\boxed{}; the last "the answer is X"; else the last number of the text, not counting the
    numbers of "Steps: n" and "Confidence: n/10" trailer fields. Numbers come back canonical
    ("$1,234.50" -> "1234.5", "3/4" -> "0.75"). Task "mc": the option letter ("Answer: (B)", "the
    answer is b", "B)") upper-cased.
    Task "math": the stripped content of the last \\boxed{} if any, else the trailer value, else as
    numeric.
    """
    kind = answer_kind(task)
    if text is None:
        return None
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str completion, got {type(text).__name__}")
    if not text.strip():
        return None

    if kind == "math":
        boxed = last_boxed(text)
        if boxed is not None and boxed.strip():
            return boxed.strip()
        for value in _values_after(_ANSWER_RE, text):
            value = value.strip().strip("*_ \t").rstrip(".").strip().strip("$").strip()
            if value:
                return value
        kind = "number"  # no box and no trailer: read it like a numeric task

    read = _letter_in if kind == "mc" else _number_in
    for value in _values_after(_ANSWER_RE, text):
        found = read(value)
        if found is not None:
            return found
    boxed = last_boxed(text)
    if boxed is not None:
        found = read(boxed)
        if found is not None:
            return found
    for value in _values_after(_ANSWER_IS_RE, text):
        found = read(value)
        if found is not None:
            return found

    if kind == "mc":
        last = None
        for last in _LETTER_LAST.finditer(text):
            pass
        return next(g for g in last.groups() if g).upper() if last else None

    # Last number, with trailer fields blanked so "Confidence: 8/10" never becomes the answer.
    body = _delatex(_TRAILER_FIELD_RE.sub(" ", text))
    last = None
    for last in _NUM_RE.finditer(body):
        pass
    return _canon_token(last.group()) if last else None


def strict_answer(text: str | None, task: str) -> str | None:
    """The answer a training reward reads: the `Answer:` field the prompt asks for, and nothing
    else. The completion must hold exactly one such field, on its last non-blank line, and the
    field's value must be one answer of the task's kind as a whole: one number (a sign, currency,
    thousands commas, a unit word after it, as _parse reads), one option letter (task "mc"), one
    LaTeX expression (task "math", a \\boxed{} around it allowed). Else None: no field, several
    ("Answer: 3" then "Answer: 5"), text after it, "the answer is 5" or a bare \\boxed{5}, a
    computation ("Answer: 2 + 3 = 5"), a value followed by more values. Canonical as
    extract_answer's."""
    kind = answer_kind(task)
    if not isinstance(text, str):
        return None
    fields = list(_ANSWER_RE.finditer(text))
    if len(fields) != 1:
        return None
    line_end = text.find("\n", fields[0].end())
    if line_end >= 0 and text[line_end:].strip():
        return None
    value = text[fields[0].end() : len(text) if line_end < 0 else line_end]
    value = value.strip().strip("*_` \t").strip()
    if kind == "mc":
        m = _LETTER_WHOLE.fullmatch(value)
        return m.group(1).upper() if m else None
    if kind == "math":
        boxed = last_boxed(value)
        if boxed is not None and value.startswith("\\boxed"):
            value = boxed
        value = value.rstrip(".").strip().strip("$").strip()
        return value or None
    number = _parse(value, units=True)
    return None if number is None else _canon(number)


def _as_text(x) -> str | None:
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        x = repr(x)
    if not isinstance(x, str) or not x.strip() or x.strip().lower().lstrip("+-") in _NAN_INF:
        return None
    return x


def is_correct(pred, gold, task: str) -> bool:
    """Whether a predicted answer matches the gold answer.

    Numeric tasks: equal values after normalize_number ("12.0" == "12", "$1,234" == "1234", "3/4" ==
    "0.75", "12 apples" == "12"), integers exactly, other numbers within REL_TOL ("0.833333" ==
    "5/6"). Task "mc": same option letter ("(b)" == "B"). Task "math": numeric when both sides are
    plain numbers, else equal LaTeX strings after _math_key. None, empty, nan and inf are always
    wrong, whatever the gold.
    """
    kind = answer_kind(task)
    pred, gold = _as_text(pred), _as_text(gold)
    if pred is None or gold is None:
        return False
    if kind == "mc":
        p = _letter_in(pred)
        return p is not None and p == _letter_in(gold)
    p, g = _parse(pred, units=(kind == "number")), _parse(gold, units=(kind == "number"))
    if p is not None and g is not None:
        return _same(p, g)
    if kind == "number":
        return False
    key = _math_key(pred)
    return bool(key) and key == _math_key(gold)


def lenient_only(text: str | None, gold, task: str) -> bool:
    """Whether the evaluation's lenient reader scores a completion right and the training reward's
    strict reader does not: right only by the reader's leniency (what a trainer logs)."""
    lenient = is_correct(extract_answer(text, task), gold, task)
    return lenient and not is_correct(strict_answer(text, task), gold, task)
