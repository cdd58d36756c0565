"""The three rings and what a reader is promised, read from the sources with `ast`: imports point
inward (lab -> spine -> library), no script is imported but by tests, the learning step of every
trainer in the spine, softrank.py torch alone, the lab run as a package (no sys.path edits), and the
documents: the reading path on README's first screen, no issue numbers, every cited `module.name`
alive. Sizes are no test's business: a student adds lines and the suite stays green
(`python -m experiments.reading_sets` reports them, as advice)."""

import ast
import importlib
import re
from pathlib import Path

import pytest

from experiments import reading_sets

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {name.removesuffix(".py") for name in reading_sets.SCRIPTS}
SPINE = reading_sets.spine_modules()
LAB = {p.stem for p in (ROOT / "experiments").glob("*.py")}
DOCUMENTS = [ROOT / "README.md", ROOT / "results" / "README.md", *(ROOT / "docs").glob("*.md")]


def library_files():
    return [ROOT / "common.py", *(ROOT / "llm").glob("*.py"), *(ROOT / "data").glob("*.py")]


def imports_of(path):
    """Every absolute module name `path` imports, whole (`llm.engine`, `experiments.tables`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == "experiments":
                found.update(f"experiments.{alias.name}" for alias in node.names)
    return found


def test_the_library_imports_nothing_of_the_spine_or_the_lab():
    for path in library_files():
        tops = {name.split(".")[0] for name in imports_of(path)}
        assert not tops & (SPINE | {"experiments"}), path.relative_to(ROOT)


def test_common_imports_nothing_of_the_engine():
    """Within the library the engine (llm/) reads common.py, never the reverse: the plumbing every
    script shares does not load the engine (and transformers) with it."""
    tops = {name.split(".")[0] for name in imports_of(ROOT / "common.py")}
    assert "llm" not in tops


def test_the_spine_imports_no_lab_and_no_script_imports_another():
    for name in SPINE:
        tops = {m.split(".")[0] for m in imports_of(ROOT / f"{name}.py")}
        assert "experiments" not in tops, name
        assert not tops & (SCRIPTS - {name}), name


def studied_script(path):
    """The stage script a lab file is a study of (its Config subclasses the script's: it hands the
    script its own piece, cleanrl's variant beside its script), else None."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            bases = [b.value.id for b in node.bases if isinstance(b, ast.Attribute)]
            return next((b for b in bases if b in SCRIPTS), None)
    return None


def test_nothing_but_tests_and_a_study_imports_a_script():
    """A script is imported by the tests, and by a study of it in the lab (that script alone);
    no library or spine module, no other lab file."""
    sources = library_files() + [ROOT / f"{n}.py" for n in SPINE]
    sources += list((ROOT / "experiments").glob("*.py"))
    studies = 0
    for path in sources:
        tops = {m.split(".")[0] for m in imports_of(path)}
        allowed = (
            {path.stem, studied_script(path)} if path.parent.name == "experiments" else {path.stem}
        )
        studies += studied_script(path) is not None
        assert not tops & (SCRIPTS - allowed), path.relative_to(ROOT)
    assert studies >= 3


def test_every_trainer_reads_its_learning_step_in_the_spine():
    """The LLM-weight trainers' step (llm_step.policy_step) is a spine module each trainer imports,
    no function of the library; softrank.py, the advantage math, imports torch alone, so it can be
    copied on its own."""
    for script in ("train_solver.py", "train_magrpo.py", "train_mlpo.py"):
        assert "llm_step" in reading_sets.reading_set(script), script
    defined = {
        node.name
        for path in library_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
    }
    assert not {"policy_step", "rollout_update", "policy_gradient_loss"} & defined
    assert imports_of(ROOT / "softrank.py") == {"torch"}


def test_the_llm_trainers_read_the_solutions_not_the_game():
    """What the LLM-weight trainers use of the game (prompts, a solution's parse, the vote, the LLM
    calls) is solutions.py; deliberate.py, the game itself, is in none of their reading sets: it
    reads solutions.py, which imports no other module of the spine."""
    for script in ("train_solver.py", "train_magrpo.py", "train_mlpo.py"):
        names = reading_sets.reading_set(script)
        assert "solutions" in names and "deliberate" not in names, script
    assert "solutions" in imports_of(ROOT / "deliberate.py")
    assert not {m.split(".")[0] for m in imports_of(ROOT / "solutions.py")} & SPINE


def test_the_reading_sets_count_what_they_say():
    """A spine module imported by a script joins its reading set, and a library module never
    does."""
    assert reading_sets.reading_set("train_rl.py") == [
        "deliberate",
        "softrank",
        "solutions",
        "train_rl",
    ]
    assert reading_sets.reading_set("sft.py") == ["deliberate", "sft", "solutions"]
    assert reading_sets.reading_set("train_magrpo.py") == [
        "llm_step",
        "softrank",
        "solutions",
        "train_magrpo",
    ]
    assert "common" not in SPINE
    assert {"solutions", "deliberate", "softrank", "stats", "llm_step"} <= SPINE


def test_the_lab_runs_as_a_package():
    for path in (ROOT / "experiments").glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, path.name
        assert "noqa: E402" not in text, path.name
        for name in imports_of(path):
            # a module of the lab is imported as experiments.NAME, never by its bare name
            assert name.split(".")[0] not in LAB, (path.name, name)


# --------------------------------------------------------------------------------------------------
# the documents
# --------------------------------------------------------------------------------------------------
def test_readme_leads_with_the_method_and_the_reading_path():
    lines = (ROOT / "README.md").read_text().splitlines()
    first_screen = "\n".join(lines[:60])
    for name in ("sft", "train_rl", "train_magrpo", "solutions", "deliberate", "softrank"):
        assert f"{name}.py" in first_screen, name
    assert "make demo" in first_screen and "make test" in first_screen
    # the student's tests, one command that runs tests/method alone
    assert "make test-method" in first_screen
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test-method:.*\n\t.*pytest -q tests/method$", makefile, re.M)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_in_the_documents(path):
    found = re.findall(r"\b[Ii]ssues? \d+|#\d{2,}\b", path.read_text())
    assert found == []


def cited_names(text):
    """Every backticked dotted name that starts with a module of the project."""
    project = SPINE | {"common", "llm", "data", "experiments"}
    files = {"py", "json", "jsonl", "md", "pt", "sh", "png", "html", "csv", "db", "txt"}
    names = re.findall(r"`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`", text)
    return sorted(
        {n for n in names if n.split(".")[0] in project and n.split(".")[-1] not in files}
    )


def resolve(name):
    """The object a dotted name names: its longest importable prefix, then attributes."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[k:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(name)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_name_exists(path):
    missing = []
    for name in cited_names(path.read_text()):
        try:
            resolve(name)
        except (AttributeError, ModuleNotFoundError):
            missing.append(name)
    assert missing == []


def test_the_cited_names_check_sees_a_stale_name():
    text = "run `train_rl.make_loss`, `deliberate.play()`, `torch.compile`, `softrank.py`"
    assert cited_names(text) == ["deliberate.play", "train_rl.make_loss"]
    with pytest.raises(AttributeError):
        resolve("train_rl.make_loss")
    assert resolve("llm.engine.Engine.generate") is not None


def module_graph(root):
    """Every module of the tree under `root` (its top-level files and its packages' files, tests
    aside) -> the modules of that tree it imports anywhere in its source, inside functions too, a
    relative import resolved against its package."""
    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[0] in {"tests", ".venv", "runs", "cache"} or parts[0].startswith("."):
            continue
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = sorted(found & set(files) - {name})
    return graph


def import_circles(graph):
    """Each circle of imports in `graph`, as the list of modules around it (depth-first search)."""
    circles, state = [], {}

    def visit(name, path):
        state[name] = "open"
        for target in graph[name]:
            if state.get(target) == "open":
                circles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return circles


def test_no_import_circles_counting_imports_inside_functions():
    assert import_circles(module_graph(ROOT)) == []


def test_the_circle_check_sees_an_import_inside_a_function(tmp_path):
    """A planted circle closed by a function-level import and one by a relative import are found;
    the same tree without them has none."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from .b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    return 1\n")
    (tmp_path / "top.py").write_text("import pkg.a\n")
    (tmp_path / "other.py").write_text("def g():\n    return 2\n")
    assert import_circles(module_graph(tmp_path)) == []
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import a\n\n    return a\n")
    assert import_circles(module_graph(tmp_path)) == [["pkg.a", "pkg.b", "pkg.a"]]
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    return 1\n")
    (tmp_path / "other.py").write_text("def g():\n    import top\n\n    return top\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    import other\n\n    return other\n")
    assert import_circles(module_graph(tmp_path)) == [["other", "top", "pkg.a", "pkg.b", "other"]]


def test_a_stage_script_declares_every_flag_in_its_own_class():
    """A reader finds all of a script's flags in its Config; only a study of it (in the lab)
    subclasses it."""
    for name in SCRIPTS:
        tree = ast.parse((ROOT / f"{name}.py").read_text())
        configs = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Config"]
        assert all(not c.bases for c in configs), name
