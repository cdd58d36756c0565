"""eval.py's transcripts as one page to read in a browser: every game of every protocol.

    python view.py runs/demo/results.json --out runs/demo/games.html

One self-contained HTML file (inline CSS and JS; no server, nothing fetched). At the top, eval.py's
table and the action shares by round; then per question one card per protocol: the agents x rounds
grid (each answer right or wrong, each action, and where a learned policy played, its action
probabilities and the confidence and agreement it read), the vote after each round, the tokens
spent, the completion texts on demand. Filters: protocol, outcome, questions where the shown
protocols disagree, games whose vote changed. They live in the URL (#outcome=wrong&changed=1), so
a filtered page can be reopened or shared.
"""

import json
from dataclasses import dataclass
from html import escape
from pathlib import Path

from common import UsageError, parse_config, user_errors

KINDS = ("persist", "refine", "concede")
# short names of the state features a transcript keeps (deliberate.EXPLAINED_FEATURES)
SHORT = {
    "mean_prob": "mean p",
    "min_prob": "min p",
    "tail_prob": "tail p",
    "peer_agreement": "agree",
    "is_majority": "majority",
}


@dataclass
class Config:
    results: str = ""
    """eval.py's JSON (its --out), written with the transcripts (eval.py's default --details)"""
    out: str = ""
    """the HTML page (empty: the results file with the suffix .html)"""

    POSITIONAL = ("results",)


def load(path):
    """eval.py's JSON; a file without transcripts is the user's mistake, said in one line."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: not a readable eval.py JSON ({error})") from None
    if not isinstance(results, dict) or not results.get("details"):
        seeds = isinstance(results, dict) and results.get("config", {}).get("seeds")
        where = " (with --seeds, each seed's own file holds them)" if seeds else ""
        raise UsageError(
            f"{path} has no transcripts to show: eval.py writes them unless --no-details{where}"
        )
    return results


# --------------------------------------------------------------------------------------------------
# Pieces of the page: every string that comes from the JSON goes through escape().
# --------------------------------------------------------------------------------------------------
def mark(ok):
    return {True: "ok", False: "bad", None: "na"}[ok]


def answer_cell(answer, ok, extra=""):
    """An answer, right (ok True) or wrong; None for an answer or ok that the file does not hold
    (written before eval.py kept it)."""
    shown = "unparsed" if answer is None else answer
    symbol = {True: "✓ ", False: "✗ ", None: ""}[ok]
    return f'<td class="{mark(ok)}"><b>{symbol}{escape(str(shown))}</b>{extra}</td>'


def text(body):
    return f"<details><summary>text</summary><pre>{escape(body)}</pre></details>"


def peers_of(agent, agents):
    return [j for j in range(agents) if j != agent]


def action_name(action, agent, agents):
    """deliberate.py's actions: PERSIST, REFINE, then CONCEDE to each peer in agent order."""
    if action < 2:
        return KINDS[action].upper()
    return f"CONCEDE→A{peers_of(agent, agents)[action - 2]}"


def explained(why, action, agent, agents):
    """A learned policy's decision: its action probabilities (the taken one in bold) and the
    features it read."""
    labels = ["P", "R"] + [f"→A{j}" for j in peers_of(agent, agents)]
    probs = " ".join(
        f"<b>{escape(k)} {p:.2f}</b>" if a == action else f"{escape(k)} {p:.2f}"
        for a, (k, p) in enumerate(zip(labels, why["probs"]))
    )
    state = why.get("state", {})
    read = " ".join(f"{escape(SHORT.get(k, k))} {v:.2f}" for k, v in state.items())
    about = "action probabilities; features read: " + ", ".join(state)
    return f'<div class="why" title="{escape(about)}">{probs}<br>{read}</div>'


def game_rows(r, agents, rounds, names):
    """The grid of a game: one row per agent, one column per round, then the vote."""
    rows = []
    for i in range(agents):
        cells = []
        for t in range(rounds + 1):
            if t >= len(r["rounds"]):
                cells.append('<td class="stop">stopped</td>')
                continue
            record = r["rounds"][t]
            extra = ""
            if t:
                action = record["actions"][i]
                extra += f'<div class="act">{action_name(action, i, agents)}</div>'
                if "policy" in record:
                    extra += explained(record["policy"][i], action, i, agents)
            # a PERSIST keeps the text and a CONCEDE copies a peer's: only new texts are shown
            if t == 0 or record["actions"][i] == 1:
                extra += text(record["texts"][i])
            cells.append(answer_cell(record["answers"][i], record["agent_correct"][i], extra))
        rows.append((names[i], cells))
    votes = [answer_cell(x["vote"], x["correct"]) for x in r["rounds"]]
    rows.append(("vote", votes + ['<td class="stop"></td>'] * (rounds + 1 - len(votes))))
    return rows


def leader_rows(r, agents, names):
    """MLPO: the peers' answers the leader read in each round, then the leader's answer."""
    rows = []
    for i in range(agents if "peer_answers" in r else 0):
        cells = [answer_cell(a[i], ok[i]) for a, ok in zip(r["peer_answers"], r["peer_correct"])]
        rows.append((names[i], cells))
    answers = r.get("leader_answers", ["?"] * len(r["leader_correct"]))
    cells = [
        answer_cell(a, ok, text(body))
        for a, ok, body in zip(answers, r["leader_correct"], r["texts"])
    ]
    return rows + [("leader", cells)]


def sample_rows(r):
    """vanilla, alone, cot, sc: the samples (one for a greedy answer), then their vote."""
    answers = r.get("answers", ["?"] * len(r["texts"]))
    oks = r.get("answer_correct", [None] * len(r["texts"]))
    cells = [answer_cell(a, ok, text(body)) for a, ok, body in zip(answers, oks, r["texts"])]
    return [("samples", cells), ("vote", [answer_cell(r["pred"], r["correct"])])]


def vote_changed(r):
    if "rounds" in r:
        votes = [x["vote"] for x in r["rounds"]]
    else:
        votes = r.get("leader_answers", [])
    return any(a != b for a, b in zip(votes, votes[1:]))


def card(p, protocol, r, config, names):
    agents, rounds = config["agents"], config["rounds"]
    if "rounds" in r:
        rows, columns = game_rows(r, agents, rounds, names), ("round", rounds + 1)
    elif "leader_correct" in r:
        rows, columns = leader_rows(r, agents, names), ("round", len(r["leader_correct"]))
    else:
        rows, columns = sample_rows(r), ("sample", len(r["texts"]))
    head = "".join(f"<th>{columns[0]} {t}</th>" for t in range(columns[1]))
    body = "".join(f"<tr><th>{escape(name)}</th>{''.join(cells)}</tr>" for name, cells in rows)
    changed = vote_changed(r)
    return (
        f'<div class="game {mark(r["correct"])}" data-p="{p}" data-ok="{int(r["correct"])}" '
        f'data-changed="{int(changed)}"><h3>{"✓" if r["correct"] else "✗"} {escape(protocol)}</h3>'
        f'<p class="cost">{r["tokens"]} tokens, {r["calls"]} LLM calls'
        f"{', the vote changed' if changed else ''}</p>"
        f'<table class="grid"><tr><th></th>{head}</tr>{body}</table></div>'
    )


def agent_names(config):
    """A0, A1, ...; with a team (--models), each agent's model and adapter file."""
    models = [m for m in config.get("models", "").split(",") if m]
    names = [f"A{i}" for i in range(config["agents"])]
    if len(models) == len(names):
        names = [
            f"{n} {'+'.join(Path(part).name for part in m.split('+'))}"
            for n, m in zip(names, models)
        ]
    return names


def tables(results, protocols):
    """eval.py's printed table, then the action shares and the vote's accuracy by round."""
    first = results[protocols[0]]
    ref = first.get("vs_reference", {}).get("reference")
    head = ["protocol", "accuracy ± s.e.", "tokens/q", "calls/q", "unparsed", "actions p/r/c"]
    head += [f"vs {ref} [95% CI] (disagree)"] if ref else []
    rows = []
    for name in protocols:
        s = results[name]
        actions = s.get("actions")
        row = [
            name,
            f"{s['accuracy']:.3f} ± {s['stderr']:.3f}",
            f"{s['tokens_per_question']:.0f}",
            f"{s['calls_per_question']:.1f}",
            f"{s['unparseable']:.3f}",
            "/".join(f"{actions[k]:.2f}" for k in KINDS) if actions else "-",
        ]
        if ref:
            v = s["vs_reference"]
            row.append(
                f"{v['diff']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}] ({v['disagree']})"
            )
        rows.append(row)
    by_round = max(len(results[p].get("actions_by_round", [])) for p in protocols)
    accuracy = max(len(results[p].get("accuracy_per_round", [])) for p in protocols)
    head2 = ["protocol"] + [f"round {t + 1} p/r/c" for t in range(by_round)]
    head2 += [f"accuracy round {t}" for t in range(accuracy)]
    rows2 = []
    for name in protocols:
        shares = results[name].get("actions_by_round", [])
        shares = ["/".join(f"{s[k]:.2f}" for k in KINDS) for s in shares]
        per_round = [f"{a:.3f}" for a in results[name].get("accuracy_per_round", [])]
        rows2.append(
            [name]
            + shares
            + ["-"] * (by_round - len(shares))
            + per_round
            + ["-"] * (accuracy - len(per_round))
        )
    return table(head, rows) + "<h2>Actions and accuracy by round</h2>" + table(head2, rows2)


def table(head, rows):
    cells = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return (
        '<table class="summary"><tr>'
        + "".join(f"<th>{escape(h)}</th>" for h in head)
        + f"</tr>{cells}</table>"
    )


def views_of(games, names):
    """What each agent was told of a question whose values are dealt among them (task split), one
    line per agent; nothing where every agent was told the question whole."""
    views = next((r["views"] for _, r in games if "views" in r), None)
    if not views or len(set(views)) == 1:
        return ""
    rows = "".join(
        f"<li><b>{escape(names[i] if i < len(names) else f'agent {i + 1}')}</b> was told: "
        f"{escape(view)}</li>"
        for i, view in enumerate(views)
    )
    return f'<ul class="views">{rows}</ul>'


def page(results):
    config, details = results["config"], results["details"]
    protocols = list(details)
    names = agent_names(config)
    by_id = {p: {r["id"]: r for r in details[p]} for p in protocols}
    questions = list(dict.fromkeys(r["id"] for p in protocols for r in details[p]))
    sections = []
    for q, qid in enumerate(questions, 1):
        games = [(p, by_id[name].get(qid)) for p, name in enumerate(protocols)]
        games = [(p, r) for p, r in games if r]
        asked = next((r["question"] for _, r in games if "question" in r), "")
        cards = "".join(card(p, protocols[p], r, config, names) for p, r in games)
        gold = escape(str(games[0][1]["gold"]))
        sections.append(
            f'<section class="q"><h2>{q}. {escape(qid)} <small>gold {gold}</small></h2>'
            f'<pre class="question">{escape(asked)}</pre>{views_of(games, names)}{cards}</section>'
        )
    team = config.get("models") or config.get("model") or "the default backbone"
    about = (
        f"task {config['task']} ({config.get('split') or 'default split'}, n={len(questions)}), "
        f"{config['agents']} agents, {config['rounds']} rounds, seed {config['seed']}, model "
        f"{team}, vote tie-break {config.get('vote', 'mean_prob')}"
    )
    boxes = "".join(
        f'<label><input type="checkbox" name="p" value="{p}" checked> {escape(name)}</label>'
        for p, name in enumerate(protocols)
    )
    return TEMPLATE.format(
        about=escape(about),
        tables=tables(results, protocols),
        boxes=boxes,
        games=sum(len(details[p]) for p in protocols),
        questions="".join(sections),
    )


# Filters hide cards with the `hidden` attribute (what a dumped DOM shows); data-ready marks the
# page filtered, with the milliseconds since navigation began.
TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>MPDF games</title><style>
body {{ font: 13px system-ui, sans-serif; margin: 0 1em; color: #222; }}
[hidden] {{ display: none !important; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 2px 5px; vertical-align: top; text-align: left; }}
.summary td:not(:first-child) {{ font-family: monospace; white-space: nowrap; }}
#filters {{ position: sticky; top: 0; z-index: 1; background: #f4f4f4; padding: 6px;
  border-bottom: 1px solid #aaa; }}
#filters label {{ margin-right: 1em; white-space: nowrap; }}
.q {{ border-top: 2px solid #888; margin-top: 1em; display: flex; flex-wrap: wrap; gap: 8px; }}
.q h2 {{ width: 100%; margin: 6px 0 0; font-size: 15px; }}
.q pre.question {{ width: 100%; max-width: none; margin: 0; }}
.game {{ border: 2px solid; border-radius: 4px; padding: 4px; max-width: 100%; overflow-x: auto; }}
.game.ok {{ border-color: #3a3; }} .game.bad {{ border-color: #c33; }}
.game h3 {{ margin: 0; font-size: 13px; }} .cost {{ margin: 0 0 4px; color: #555; }}
td.ok {{ background: #dfd; }} td.bad {{ background: #fdd; }} td.stop {{ color: #888; }}
.act {{ font-weight: bold; color: #225; }} .why {{ font: 11px monospace; color: #444; }}
pre {{ white-space: pre-wrap; max-width: 40em; margin: 2px 0; }}
summary {{ cursor: pointer; color: #36c; }}
</style></head><body>
<h1>MPDF games</h1><p>{about}</p>
<h2>eval.py's table</h2>{tables}
<p>Cells: each agent's answer after the round (✓ right, ✗ wrong), the action that made it
(PERSIST, REFINE, CONCEDE→ the peer adopted) and, where a learned policy played, its action
probabilities (P, R, →peer; the taken one in bold) and the state features it read. The vote row is
the team's answer.</p>
<form id="filters">{boxes}<br>
<label>outcome <select name="outcome"><option value="">all</option><option value="right">right
</option><option value="wrong">wrong</option></select></label>
<label><input type="checkbox" name="disagree"> questions where the shown protocols disagree</label>
<label><input type="checkbox" name="changed"> games whose vote changed between rounds</label>
<span id="count"></span> of {games} games shown</form>
{questions}
<script>
const form = document.getElementById("filters");
function apply() {{
  const shown = new Set([...form.querySelectorAll("[name=p]:checked")].map(b => b.value));
  const outcome = form.outcome.value, disagree = form.disagree.checked;
  const changed = form.changed.checked;
  let count = 0;
  for (const q of document.querySelectorAll(".q")) {{
    const games = [...q.querySelectorAll(".game")].filter(g => shown.has(g.dataset.p));
    const split = new Set(games.map(g => g.dataset.ok)).size > 1;
    let any = false;
    for (const g of q.querySelectorAll(".game")) {{
      const keep = shown.has(g.dataset.p) && (!disagree || split)
        && (!outcome || (g.dataset.ok === "1") === (outcome === "right"))
        && (!changed || g.dataset.changed === "1");
      g.hidden = !keep;
      any ||= keep;
      count += keep;
    }}
    q.hidden = !any;
  }}
  document.getElementById("count").textContent = count;
  const state = new URLSearchParams();
  if (shown.size < form.querySelectorAll("[name=p]").length) state.set("p", [...shown].join(","));
  if (outcome) state.set("outcome", outcome);
  if (disagree) state.set("disagree", 1);
  if (changed) state.set("changed", 1);
  history.replaceState(null, "", "#" + state);
}}
const asked = new URLSearchParams(location.hash.slice(1));
if (asked.has("p")) {{
  const wanted = asked.get("p").split(",");
  for (const b of form.querySelectorAll("[name=p]")) b.checked = wanted.includes(b.value);
}}
form.outcome.value = asked.get("outcome") || "";
form.disagree.checked = asked.has("disagree");
form.changed.checked = asked.has("changed");
form.addEventListener("change", apply);
apply();
document.body.dataset.ready = Math.round(performance.now());
</script></body></html>
"""


def main(cfg):
    results = load(cfg.results)
    out = Path(cfg.out or Path(cfg.results).with_suffix(".html"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page(results), encoding="utf-8")
    games = sum(len(r) for r in results["details"].values())
    print(f"{games} games of {len(results['details'])} protocols: {out}")


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors():
        main(config)
