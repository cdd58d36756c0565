"""Every piece plays a policy in the game it was trained in (deliberate.check_own_game), or says it
studies transfer (eval.py --any-game): a rerun of any piece is not refused, and no table plays a
policy outside its game by accident."""

import json
from pathlib import Path

import common
import deliberate
import eval as E
from common import parse_config
from experiments.pieces import PIECES

ROOT = Path(__file__).resolve().parents[2]


def recorded_game(policy):
    """The game a policy file records, read from its settings where this clone has them (a
    retired .pt file has left the tree, a pending piece has not made it yet: None)."""
    path = ROOT / policy
    if path.with_suffix(".json").exists():
        settings = json.loads(path.with_suffix(".json").read_text())
    elif path.exists():
        settings = common.load_tensors(path, "policy")[1]
    else:
        return None
    return deliberate.trained_game(settings)


def test_every_piece_plays_a_policy_in_its_own_game_or_says_it_studies_transfer():
    checked, elsewhere = 0, []
    for name, piece in PIECES.items():
        command = [str(c) for c in piece["command"]]
        if "eval.py" not in command:
            continue
        cfg = parse_config(E.Config, command[command.index("eval.py") + 1 :])
        for protocol in cfg.protocols.split(","):
            game = recorded_game(protocol[len("mpdf=") :]) if protocol.startswith("mpdf=") else None
            if game is None:
                continue
            checked += 1
            if any(game[k] != getattr(cfg, k) for k in deliberate.GAME_SETTINGS):
                elsewhere.append((name, cfg.any_game))
    assert checked >= 40
    assert [name for name, any_game in elsewhere if not any_game] == []
    # the transfer and scaling tables say so, and they are the only ones
    assert {name for name, _ in elsewhere} >= {"table-mawps300-seed0-softrank-arith"}
    assert all(name.startswith(("table-mawps300-", "table-scaling-")) for name, _ in elsewhere)
