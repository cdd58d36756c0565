"""view.py on an eval of a tiny random model: the page holds every game, shows model text as text,
and filters in a real browser (headless Chromium, where it is installed)."""

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from launch import run

from deliberate import MetaPolicy, save_policy

ROOT = Path(__file__).resolve().parents[1]
# a completion that would run, and mark the page, if the page did not escape it
PLANTED = "</pre><script>document.body.dataset.pwned = 1</script><b>"
# one worker for the module, and its eval run (the `results` fixture) made once on it
pytestmark = pytest.mark.xdist_group("view")


@pytest.fixture(scope="session")
def results(tmp_path_factory, tiny_model_dir):
    """eval.py's JSON of every kind of protocol, a team of two and a learned policy among them. A
    random model answers nothing right, so outcomes are set: question 0 right for every protocol,
    question 1 for debate alone; debate's vote changes on question 2; and a completion is planted
    in debate's first game."""
    folder = tmp_path_factory.mktemp("view")
    torch.manual_seed(0)
    policy = folder / "policy.safetensors"
    save_policy(MetaPolicy(agents=2), policy)
    out = folder / "results.json"
    protocols = f"vanilla,sc,debate,mpdf-persist,mpdf={policy},leader=default"
    cmd = [
        str(ROOT / "eval.py"),
        "--models",
        f"default,{tiny_model_dir}",
        "--n",
        "3",
        "--agents",
        "2",
        "--rounds",
        "1",
        "--max-new-tokens",
        "6",
        "--cache-dir",
        "",
        "--protocols",
        protocols,
        "--reference",
        "debate",
        "--out",
        str(out),
    ]
    run(cmd, folder, env={"MPDF_MODEL_DIR": tiny_model_dir})
    data = json.loads(out.read_text())
    for games in data["details"].values():
        games[0]["correct"], games[1]["correct"] = True, False
    data["details"]["debate"][1]["correct"] = True
    data["details"]["debate"][2]["rounds"][1]["vote"] = "a changed vote"
    data["details"]["debate"][0]["rounds"][0]["texts"][0] = PLANTED
    data["details"]["debate"][0]["question"] = PLANTED
    out.write_text(json.dumps(data))
    return out, data


def view(path, *extra):
    return run([ROOT / "view.py", path, *extra], Path(path).parent, check=False)


class Page(HTMLParser):
    """What a test reads of a page: the attributes of the game cards, the question sections and the
    body, the scripts, the text."""

    def __init__(self, html):
        super().__init__()
        self.games, self.questions, self.scripts, self.text = [], [], [], []
        self.body, self.count = {}, None
        self._in = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and "game" in attrs.get("class", "").split():
            self.games.append(attrs)
        if tag == "section":
            self.questions.append(attrs)
        if tag == "body":
            self.body = attrs
        self._in = "script" if tag == "script" else "count" if attrs.get("id") == "count" else None
        if self._in == "script":
            self.scripts.append("")

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        self.text.append(data)
        if self._in == "script":
            self.scripts[-1] += data
        elif self._in == "count":
            self.count = data


@pytest.fixture(scope="session")
def page(results, tmp_path_factory):
    path, _ = results
    out = tmp_path_factory.mktemp("page") / "games.html"
    proc = view(path, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(out) in proc.stdout
    return out


def test_page_holds_every_question_and_protocol_and_escapes_model_text(results, page):
    _, data = results
    parsed = Page(page.read_text())
    protocols = list(data["details"])
    games = [(p, r["id"]) for p in protocols for r in data["details"][p]]
    assert len(parsed.games) == len(games) == 6 * 3
    assert sorted(int(g["data-p"]) for g in parsed.games) == sorted(
        protocols.index(p) for p, _ in games
    )
    text = "".join(parsed.text)
    for protocol in protocols:
        assert protocol in text
    for r in data["details"]["debate"]:
        assert r["id"] in text
    # the learned policy's probabilities, the team's models and the leader's row are shown
    assert "→A1" in text and "agree" in text and "leader" in text
    assert Path(data["config"]["models"].split(",")[1]).name in text
    # the planted completion is text on the page, and the one script is the page's own
    assert PLANTED in text
    assert len(parsed.scripts) == 1 and "pwned" not in parsed.scripts[0]


def test_a_json_without_details_is_one_line_and_status_2(results, tmp_path):
    _, data = results
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({k: v for k, v in data.items() if k != "details"}))
    proc = view(bare)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "--no-details" in proc.stderr
    assert not (tmp_path / "bare.html").exists()


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(page, tmp_path, fragment=""):
    """The page's DOM after its scripts ran, in headless Chromium."""
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        page.resolve().as_uri() + fragment,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Page(proc.stdout)


@pytest.mark.skipif(
    chromium() is None, reason="chromium is not installed (apt-get install chromium)"
)
def test_the_page_in_a_browser_shows_every_game_and_filters_out_the_right_answers(
    results, page, tmp_path
):
    _, data = results
    everything = dump_dom(page, tmp_path)
    # the page's script ran and the planted one did not
    assert "data-ready" in everything.body and "data-pwned" not in everything.body
    assert len(everything.games) == 18 and not any("hidden" in g for g in everything.games)
    assert everything.count == "18"
    wrong = dump_dom(page, tmp_path, "#outcome=wrong")
    shown = [g for g in wrong.games if "hidden" not in g]
    assert len(shown) == int(wrong.count) == 18 - 6 - 1
    assert all(g["data-ok"] == "0" for g in shown)
    # question 0, right everywhere, is hidden whole
    assert ["hidden" in q for q in wrong.questions] == [True, False, False]
    # question 1 is the one where debate and vanilla disagree
    protocols = list(data["details"])
    pair = f"{protocols.index('debate')},{protocols.index('vanilla')}"
    disagree = dump_dom(page, tmp_path, f"#p={pair}&disagree=1")
    shown = [g for g in disagree.games if "hidden" not in g]
    assert sorted(g["data-ok"] for g in shown) == ["0", "1"] and disagree.count == "2"
    changed = dump_dom(page, tmp_path, "#changed=1")
    shown = [g for g in changed.games if "hidden" not in g]
    assert all(g["data-changed"] == "1" for g in shown) and int(changed.count) == len(shown)
    assert str(protocols.index("debate")) in [g["data-p"] for g in shown]
