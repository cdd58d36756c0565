"""The steps of an arithmetic expression, one line per operation, in the order Python evaluates it
(innermost first, left to right): the worked solutions of arith and split questions (data/worked.py,
data/split.py) and the split task's gold answers."""

import ast
import operator
from fractions import Fraction

OPERATORS = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
}


def _number(value: Fraction) -> str:
    if value.denominator != 1:
        raise ValueError(f"a step's result {value} is not a whole number")
    return str(value.numerator)


def expression_steps(expr: str) -> tuple[list[str], str]:
    """The lines `a op b = c` that evaluate expr, and its value. Every intermediate value must be a
    whole number (arith builds its divisions from their quotients)."""
    steps = []

    def evaluate(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            left, right = evaluate(node.left), evaluate(node.right)
            symbol, apply = OPERATORS[type(node.op)]
            if symbol == "/" and right == 0:
                raise ValueError(f"{expr!r} divides by zero")
            value = apply(left, right)
            steps.append(f"{_number(left)} {symbol} {_number(right)} = {_number(value)}")
            return value
        raise ValueError(f"{expr!r}: only whole numbers and + - * / are allowed")

    value = evaluate(ast.parse(expr, mode="eval").body)
    return steps, _number(value)
