"""The ten templates of the built-in arithmetic task and the words they draw from; data/arith.py
builds the pools from them.

Integer draws only (no float, no hash(), no set order), so the same random stream gives the same
questions on every machine. Any edit here changes the pools (and the golden hash in
tests/test_data.py).
"""

# (name, subject pronoun, possessive, object pronoun)
NAMES = (
    ("Tom", "he", "his", "him"), ("Anna", "she", "her", "her"), ("Ben", "he", "his", "him"),
    ("Maria", "she", "her", "her"), ("Sam", "he", "his", "him"), ("Lily", "she", "her", "her"),
    ("Omar", "he", "his", "him"), ("Priya", "she", "her", "her"), ("Jack", "he", "his", "him"),
    ("Emma", "she", "her", "her"), ("Leo", "he", "his", "him"), ("Sofia", "she", "her", "her"),
    ("Ravi", "he", "his", "him"), ("Grace", "she", "her", "her"), ("Noah", "he", "his", "him"),
    ("Mia", "she", "her", "her"), ("Kenji", "he", "his", "him"), ("Zoe", "she", "her", "her"),
    ("Luis", "he", "his", "him"), ("Nina", "she", "her", "her"),
)  # fmt: skip
ITEMS = (
    "apples", "marbles", "stickers", "pencils", "books", "stamps", "shells", "cards",
    "balloons", "crayons", "toy cars", "beads",
)  # fmt: skip
GOODS = (
    ("notebook", "notebooks"), ("pen", "pens"), ("sandwich", "sandwiches"), ("ticket", "tickets"),
    ("toy", "toys"), ("shirt", "shirts"), ("book", "books"), ("cake", "cakes"),
    ("game", "games"), ("lamp", "lamps"), ("hat", "hats"), ("ball", "balls"),
)  # fmt: skip
FOODS = ("muffins", "cookies", "rolls", "cupcakes", "bagels", "pies")
RELATIVES = ("sister", "brother", "friend", "cousin", "neighbor")
VEHICLES = ("car", "bus", "train", "truck", "van", "boat")
BAKERS = ("bakery", "cafe", "shop", "market stall", "hotel kitchen")
WISHES = ("bike", "laptop", "guitar", "tablet", "camera", "phone", "telescope", "scooter")


def _person(r):
    return NAMES[r.randrange(len(NAMES))]


def _people(r, k):
    """k different people (k <= 3), drawn with integer draws only."""
    picked = []
    while len(picked) < k:
        p = _person(r)
        if p not in picked:
            picked.append(p)
    return picked


def _two_goods(r):
    i = r.randrange(len(GOODS))
    j = (i + 1 + r.randrange(len(GOODS) - 1)) % len(GOODS)
    return GOODS[i], GOODS[j]


def _rest_divisible(r, total, d, max_steps=None, min_share=1):
    """A number c >= 1 to take away from total so that (total - c) splits into d equal shares >=
    min_share.

    Needs total >= (min_share + 1) * d. max_steps caps how many extra multiples of d c may hold.
    """
    c0 = total % d or d
    q = (total - c0) // d  # largest possible share
    top = q - min_share if max_steps is None else min(q - min_share, max_steps)
    return c0 + d * r.randint(0, top)


# Every template: (rng, level) -> (question, integer
# answer, expression over the numbers in the question).


def buy_more(r, L):
    name, he, _, _ = _person(r)
    He, item = he.capitalize(), r.choice(ITEMS)
    hi = (0, 30, 80, 300, 1000)[L]
    a, b = r.randint(2, hi), r.randint(2, hi)
    if L == 1:
        return (
            f"{name} has {a} {item} and buys {b} more. How many {item} does {he} have now?",
            a + b,
            f"{a} + {b}",
        )
    if L == 2:
        c = r.randint(2, a + b - 1)
        return (
            f"{name} has {a} {item}. {He} buys {b} more and then gives {c} to a friend. "
            f"How many {item} does {he} have now?",
            a + b - c,
            f"{a} + {b} - {c}",
        )
    k, m = r.randint(2, 3 * L), r.randint(5, hi // 10)
    total = a + k * m
    if L == 3:
        c = r.randint(2, total - 1)
        return (
            f"{name} has {a} {item}. {He} buys {k} packs with {m} {item} in each pack and then "
            f"gives {c} to a friend. How many {item} does {he} have now?",
            total - c,
            f"{a} + {k} * {m} - {c}",
        )
    d = r.randint(3, 9)
    c = _rest_divisible(r, total, d)
    return (
        f"{name} has {a} {item}. {He} buys {k} packs with {m} {item} in each pack. {He} gives {c} "
        f"{item} to a friend and puts the rest equally into {d} boxes. How many {item} are in each "
        "box?",
        (total - c) // d,
        f"({a} + {k} * {m} - {c}) / {d}",
    )


def shopping(r, L):
    name, he, _, _ = _person(r)
    He = he.capitalize()
    (one, many), (_, many2) = _two_goods(r)
    p_hi, k_hi = (0, 10, 20, 50, 200)[L], (0, 9, 12, 15, 30)[L]
    k, p = r.randint(2, k_hi), r.randint(2, p_hi)
    if L == 1:
        return (
            f"A {one} costs {p} dollars. {name} buys {k} {many}. How many dollars does {he} spend?",
            k * p,
            f"{k} * {p}",
        )
    j, q = r.randint(2, k_hi), r.randint(2, p_hi)
    bought = f"{name} buys {k} {many} for {p} dollars each and {j} {many2} for {q} dollars each"
    if L == 2:
        return (
            f"{bought}. How many dollars does {he} spend in total?",
            k * p + j * q,
            f"{k} * {p} + {j} * {q}",
        )
    if L == 3:
        total, expr = k * p + j * q, f"{k} * {p} + {j} * {q}"
    else:
        (_, many3), _ = _two_goods(r)
        while many3 in (many, many2):
            (_, many3), _ = _two_goods(r)
        i, s = r.randint(2, k_hi), r.randint(2, p_hi)
        bought = (
            f"{name} buys {k} {many} for {p} dollars each, {j} {many2} for {q} dollars each and "
            f"{i} {many3} for {s} dollars each"
        )
        total, expr = k * p + j * q + i * s, f"{k} * {p} + {j} * {q} + {i} * {s}"
    bill = (total // 50 + 1 + r.randint(0, 3)) * 50
    return (
        f"{bought}. {He} pays with {bill} dollars. How many dollars of change does {he} get?",
        bill - total,
        f"{bill} - ({expr})",
    )


def share(r, L):
    name, he, _, him = _person(r)
    He, item = he.capitalize(), r.choice(ITEMS)
    if L == 1:
        k, per = r.randint(2, 6), r.randint(2, 10)
        return (
            f"{name} has {k * per} {item} and shares them equally among {k} friends. "
            f"How many {item} does each friend get?",
            per,
            f"{k * per} / {k}",
        )
    if L == 2:
        k, per, c = r.randint(2, 8), r.randint(2, 15), r.randint(2, 20)
        tot = k * per + c
        return (
            f"{name} has {tot} {item}. {He} keeps {c} for {him}self and shares the rest equally "
            f"among {k} friends. How many {item} does each friend get?",
            per,
            f"({tot} - {c}) / {k}",
        )
    b, m, k = (
        r.randint(2, (9, 20)[L - 3]),
        r.randint((12, 20)[L - 3], (30, 60)[L - 3]),
        r.randint(3, (6, 12)[L - 3]),
    )
    total = b * m
    c = _rest_divisible(r, total, k, max_steps=5, min_share=L - 2)
    per = (total - c) // k
    story = (
        f"{name} buys {b} bags of {item} with {m} {item} in each bag. {He} keeps {c} for {him}self "
        f"and shares the rest equally among {k} friends."
    )
    if L == 3:
        return f"{story} How many {item} does each friend get?", per, f"({b} * {m} - {c}) / {k}"
    e = r.randint(1, per - 1)
    return (
        f"{story} Each friend then gives {e} of them to a teacher. How many {item} does each "
        "friend have left?",
        per - e,
        f"({b} * {m} - {c}) / {k} - {e}",
    )


def spending(r, L):
    name, he, _, _ = _person(r)
    He = he.capitalize()
    (x, xs), (y, _) = _two_goods(r)
    if L == 1:
        m = r.randint(10, 50)
        s = r.randint(2, m - 1)
        return (
            f"{name} has {m} dollars. {He} spends {s} dollars on a {x}. How many dollars does {he} "
            "have left?",
            m - s,
            f"{m} - {s}",
        )
    if L == 2:
        m = r.randint(20, 200)
        s1 = r.randint(2, m // 2)
        s2 = r.randint(2, m - s1 - 1)
        return (
            f"{name} has {m} dollars. {He} spends {s1} dollars on a {x} and {s2} dollars on a {y}. "
            f"How many dollars does {he} have left?",
            m - s1 - s2,
            f"{m} - {s1} - {s2}",
        )
    if L == 3:
        k, p, s = r.randint(2, 8), r.randint(3, 30), r.randint(5, 60)
        m = k * p + s + r.randint(1, 100)
        return (
            f"{name} has {m} dollars. {He} buys {k} {xs} for {p} dollars each and a {y} for {s} "
            f"dollars. How many dollars does {he} have left?",
            m - k * p - s,
            f"{m} - {k} * {p} - {s}",
        )
    m0, w, h, k = r.randint(100, 1000), r.randint(8, 40), r.randint(5, 40), r.randint(2, 12)
    have = m0 + w * h
    p = r.randint(10, max(10, min(100, have // (2 * k))))
    s = r.randint(10, have - k * p - 1)
    return (
        f"{name} has {m0} dollars in savings. {He} works {h} hours and earns {w} dollars per hour. "
        f"Then {he} buys {k} {xs} for {p} dollars each and a {y} for {s} dollars. How many dollars "
        f"does {he} have now?",
        have - k * p - s,
        f"{m0} + {w} * {h} - {k} * {p} - {s}",
    )


def rate_time(r, L):
    unit, vehicle = r.choice(("km", "miles")), r.choice(VEHICLES)
    if L == 1:
        v, t = r.randint(2, 15), r.randint(2, 9)
        if r.randint(0, 1):
            name, he, _, _ = _person(r)
            return (
                f"{name} reads {v} pages every day. How many pages does {he} read in {t} days?",
                v * t,
                f"{v} * {t}",
            )
        return (
            f"A {vehicle} travels {v} {unit} every hour. How many {unit} does it travel in {t} "
            "hours?",
            v * t,
            f"{v} * {t}",
        )
    lo, hi, t_hi = (0, 10, 20, 40)[L - 1], (0, 80, 100, 120)[L - 1], (0, 8, 8, 10)[L - 1]
    legs = [(r.randint(lo, hi), r.randint(2, t_hi)) for _ in range(2 if L < 4 else 3)]
    said = " and then at ".join(f"{v} {unit} per hour for {t} hours" for v, t in legs)
    dist, expr = sum(v * t for v, t in legs), " + ".join(f"{v} * {t}" for v, t in legs)
    if L == 2:
        return (
            f"A {vehicle} travels at {said}. How many {unit} does it travel in total?",
            dist,
            expr,
        )
    trip = dist + r.randint(10, 300 if L == 3 else 2000)
    return (
        f"A trip is {trip} {unit} long. A {vehicle} travels at {said}. How many {unit} of the trip "
        "are left?",
        trip - dist,
        f"{trip} - ({expr})",
    )


def ages(r, L):
    (a_name, *_), (b_name, *_), (c_name, *_) = _people(r, 3)
    a_hi, b_hi = (0, 15, 20, 20, 30)[L], (0, 12, 15, 15, 20)[L]
    a, b = r.randint(3, a_hi), r.randint(2, b_hi)
    said = f"{a_name} is {a} years old. {b_name} is {b} years older than {a_name}."
    if L == 1:
        return f"{said} How old is {b_name}?", a + b, f"{a} + {b}"
    if L == 2:
        y = r.randint(2, 15)
        return f"{said} How old will {b_name} be in {y} years?", a + b + y, f"{a} + {b} + {y}"
    said += f" {c_name} is twice as old as {b_name}."
    total, expr = a + (a + b) + 2 * (a + b), f"{a} + ({a} + {b}) + 2 * ({a} + {b})"
    if L == 3:
        return (
            f"{said} What is the sum of the ages of {a_name}, {b_name} and {c_name}?",
            total,
            expr,
        )
    y = r.randint(2, 20)
    return (
        f"{said} In {y} years, what will be the sum of their three ages?",
        total + 3 * y,
        f"({a} + {y}) + ({a} + {b} + {y}) + (2 * ({a} + {b}) + {y})",
    )


def compare(r, L):
    (a_name, *_), (b_name, *_), (c_name, *_) = _people(r, 3)
    item = r.choice(ITEMS)
    if L == 1:
        a = r.randint(5, 30)
        b = r.randint(2, a - 1)
        return (
            f"{a_name} has {a} {item}. {b_name} has {b} {item}. How many more {item} does {a_name} "
            f"have than {b_name}?",
            a - b,
            f"{a} - {b}",
        )
    a, k = r.randint(3, (0, 0, 30, 60, 300)[L]), r.randint(2, (0, 0, 6, 5, 8)[L])
    said = f"{a_name} has {a} {item}. {b_name} has {k} times as many {item} as {a_name}."
    if L == 2:
        return (
            f"{said} How many more {item} does {b_name} have than {a_name}?",
            k * a - a,
            f"{k} * {a} - {a}",
        )
    d = r.randint(1, k * a - 1)
    said += f" {c_name} has {d} fewer {item} than {b_name}."
    total, expr = a + k * a + (k * a - d), f"{a} + {k} * {a} + ({k} * {a} - {d})"
    if L == 3:
        return (
            f"{said} How many {item} do {a_name}, {b_name} and {c_name} have altogether?",
            total,
            expr,
        )
    g = r.randint(1, total - 1)
    return (
        f"{said} Together they give {g} {item} to a school. How many {item} do they have left?",
        total - g,
        f"{expr} - {g}",
    )


def percent(r, L):
    name, he, his, _ = _person(r)
    He = he.capitalize()
    if L == 1:
        h, item = r.randint(2, 25), r.choice(ITEMS)
        return (
            f"{name} has {2 * h} {item} and gives half of them to {his} {r.choice(RELATIVES)}. "
            f"How many {item} does {he} have left?",
            h,
            f"{2 * h} / 2",
        )
    # Multiples of 20 (or 40) times multiples of 5 percent keep every share a whole number.
    if L == 2:
        n, p, item = 20 * r.randint(1, 25), 5 * r.randint(1, 19), r.choice(ITEMS)
        color = r.choice(("red", "blue", "green", "yellow"))
        return (
            f"{name} has {n} {item}. {p}% of them are {color}. How many of {his} {item} are not "
            f"{color}?",
            n - n * p // 100,
            f"{n} - {n} * {p} / 100",
        )
    if L == 3:
        (one, many), _ = _two_goods(r)
        c, p, k = 20 * r.randint(1, 10), 5 * r.randint(1, 15), r.randint(2, 6)
        return (
            f"A {one} costs {c} dollars. It is on sale for {p}% off. {name} buys {k} {many} at the "
            f"sale price. How many dollars does {he} pay?",
            k * (c - c * p // 100),
            f"{k} * ({c} - {c} * {p} / 100)",
        )
    w, p = 40 * r.randint(5, 100), 5 * r.randint(1, 12)
    return (
        f"{name} earns {w} dollars a month. {He} spends {p}% of it on rent and half of what is "
        f"left on food. How many dollars does {he} have left after rent and food?",
        (w - w * p // 100) // 2,
        f"({w} - {w} * {p} / 100) / 2",
    )


def bakery(r, L):
    food, baker = r.choice(FOODS), r.choice(BAKERS)
    b_hi, m_lo, m_hi = (0, 12, 12, 10, 20)[L], (0, 2, 6, 6, 12)[L], (0, 15, 24, 30, 48)[L]
    b, m = r.randint(2, b_hi), r.randint(m_lo, m_hi)
    baked = f"a {baker} bakes {b} trays of {food} with {m} {food} on each tray"
    if L == 1:
        return f"{baked[0].upper()}{baked[1:]}. How many {food} does it bake?", b * m, f"{b} * {m}"
    s = r.randint(1, b * m - 1)
    if L == 2:
        return (
            f"{baked[0].upper()}{baked[1:]}. It sells {s} of them. How many {food} are left?",
            b * m - s,
            f"{b} * {m} - {s}",
        )
    d = r.randint(2, 7 if L == 3 else 14)
    said = f"Every day {baked} and sells {s} of them."
    left, expr = d * (b * m - s), f"{d} * ({b} * {m} - {s})"
    if L == 3:
        return f"{said} How many unsold {food} does it have after {d} days?", left, expr
    g = r.randint(1, left - 1)
    return (
        f"{said} After {d} days it gives {g} of the unsold {food} to a shelter. How many unsold "
        f"{food} are left?",
        left - g,
        f"{expr} - {g}",
    )


def savings(r, L):
    name, he, his, him = _person(r)
    He, thing = he.capitalize(), r.choice(WISHES)
    if L == 1:
        w, t = r.randint(2, 20), r.randint(2, 10)
        return (
            f"{name} saves {w} dollars every week. How many dollars does {he} save in {t} weeks?",
            w * t,
            f"{w} * {t}",
        )
    if L == 2:
        a, w, t = r.randint(5, 100), r.randint(2, 30), r.randint(2, 12)
        return (
            f"{name} has {a} dollars and saves {w} dollars every week. How many dollars does {he} "
            f"have after {t} weeks?",
            a + w * t,
            f"{a} + {w} * {t}",
        )
    if L == 3:
        a, w, t = r.randint(5, 100), r.randint(5, 40), r.randint(2, 12)
        cost = a + w * t + r.randint(1, 200)
        return (
            f"{name} wants to buy a {thing} that costs {cost} dollars. {He} has {a} dollars and "
            f"saves {w} dollars every week. How many more dollars does {he} need after {t} weeks?",
            cost - a - w * t,
            f"{cost} - ({a} + {w} * {t})",
        )
    a, g, w, t = r.randint(50, 500), r.randint(10, 200), r.randint(10, 100), r.randint(3, 40)
    cost = a + g + w * t
    return (
        f"{name} wants to buy a {thing} that costs {cost} dollars. {He} has {a} dollars and gets "
        f"{g} dollars for {his} birthday. If {he} saves {w} dollars every week, how many weeks "
        f"does it take {him} to have exactly enough?",
        t,
        f"({cost} - {a} - {g}) / {w}",
    )


TEMPLATES = {f.__name__: f for f in (
    buy_more, shopping, share, spending, rate_time, ages, compare, percent, bakery, savings,
)}  # fmt: skip
