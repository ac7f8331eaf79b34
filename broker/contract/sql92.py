"""SQL92 property filters (RocketMQ's ExpressionType.SQL92): parse once, evaluate per message.

The grammar is RocketMQ's: comparisons (``= <> > >= < <=``), ``[NOT] BETWEEN x AND y``,
``[NOT] IN ('a', 'b')``, ``IS [NOT] NULL``, ``[NOT] CONTAINS / STARTSWITH / ENDSWITH 'text'``,
``AND``, ``OR``, ``NOT``, parentheses, and the constants TRUE, FALSE, strings in single quotes
(``''`` is a quote), longs and doubles. Keywords are case-insensitive; property names are not.
``TAGS`` is the message's tag (NULL when it has none).

Values are what RocketMQ makes of them: user properties are strings; compared with a number,
a property is read as a long or a double (and a property that is no number compares as
unknown). Logic is three-valued as in SQL: a comparison with a missing property is unknown,
NOT unknown is unknown, and a message matches only when the whole expression is TRUE.

Parsing uses lark (LALR); evaluation walks a tree of closures, never ``eval``. Compiled
expressions are cached (a subscription's filter is evaluated against every message it sees).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import LarkError, VisitError
from popmq.broker.contract.errors import Code, RefusedError

MAX_EXPRESSION_LENGTH = 4096
# Deeper trees are refused: evaluation recurses once per level, and no real filter nests so.
MAX_DEPTH = 64
TAGS = "TAGS"

# What evaluation sees: the tag and the user properties of one message.
Value = str | int | float | bool | None
Getter = Callable[[str, Mapping[str, str]], Value]
Predicate = Callable[[str, Mapping[str, str]], bool | None]  # (tag, properties) -> 3-valued

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)+ -> or_
    | and_expr
?and_expr: not_expr (_AND not_expr)+ -> and_
    | not_expr
?not_expr: _NOT not_expr -> not_
    | predicate
?predicate: "(" or_expr ")"
    | operand COMPARATOR operand -> compare
    | operand _IS _NULL -> is_null
    | operand _IS _NOT _NULL -> is_not_null
    | operand _BETWEEN operand _AND operand -> between
    | operand _NOT _BETWEEN operand _AND operand -> not_between
    | operand _IN "(" literal ("," literal)* ")" -> in_
    | operand _NOT _IN "(" literal ("," literal)* ")" -> not_in
    | operand TEXT_OP operand -> text_op
    | operand _NOT TEXT_OP operand -> not_text_op
    | _TRUE -> true
    | _FALSE -> false
?operand: NAME -> prop
    | literal
?literal: STRING -> string
    | NUMBER -> number
    | "-" NUMBER -> negative
    | "+" NUMBER -> number
    | _NULL -> null
COMPARATOR: "=" | "<>" | ">=" | "<=" | ">" | "<"
TEXT_OP.2: /(CONTAINS|STARTSWITH|ENDSWITH)(?![A-Za-z0-9_$.])/i
_OR.2: /OR(?![A-Za-z0-9_$.])/i
_AND.2: /AND(?![A-Za-z0-9_$.])/i
_NOT.2: /NOT(?![A-Za-z0-9_$.])/i
_IS.2: /IS(?![A-Za-z0-9_$.])/i
_NULL.2: /NULL(?![A-Za-z0-9_$.])/i
_BETWEEN.2: /BETWEEN(?![A-Za-z0-9_$.])/i
_IN.2: /IN(?![A-Za-z0-9_$.])/i
_TRUE.2: /TRUE(?![A-Za-z0-9_$.])/i
_FALSE.2: /FALSE(?![A-Za-z0-9_$.])/i
NAME: /[A-Za-z_$][A-Za-z0-9_$.]*/
STRING: /'(?:[^']|'')*'/
NUMBER: /(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?[lLdDfF]?/
%import common.WS
%ignore WS
"""

# The basic lexer keeps keywords reserved everywhere (a contextual one would read "a > AND"
# as a comparison with a property named AND).
_PARSER = Lark(_GRAMMAR, parser="lalr", lexer="basic")


def _number(text: str) -> int | float:
    text = text.rstrip("lLdDfF")
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


def _as_number(value: Value) -> int | float | None:
    """A value as a number (a property string is parsed), or None if it is none."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    if "_" in value:  # Python reads 1_000 as a number; Java (RocketMQ) does not
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number else None  # NaN compares as unknown


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


def _compare(op: str, left: Value, right: Value) -> bool | None:
    if left is None or right is None:
        return None
    numeric = isinstance(left, (int, float)) or isinstance(right, (int, float))
    if isinstance(left, bool) or isinstance(right, bool):
        numeric = False
    if numeric:
        a, b = _as_number(left), _as_number(right)
        if a is None or b is None:
            return None
        left, right = a, b
    elif op in _ORDER:
        return None  # RocketMQ orders numbers only
    if op == "=":
        return bool(left == right)
    if op == "<>":
        return bool(left != right)
    return _ORDER[op](left, right)


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _text(op: str, left: Value, right: Value) -> bool | None:
    if not isinstance(left, str) or not isinstance(right, str):
        return None
    if op == "CONTAINS":
        return right in left
    if op == "STARTSWITH":
        return left.startswith(right)
    return left.endswith(right)


def _constant(value: Value) -> Getter:
    return lambda tag, props: value


def _property(name: str) -> Getter:
    if name == TAGS:
        return lambda tag, props: tag or None
    return lambda tag, props: props.get(name)


@v_args(inline=True)
class _Compile(Transformer[Token, Any]):
    """Tree -> closures. Operands become getters, predicates 3-valued predicates."""

    def prop(self, name: Token) -> Getter:
        return _property(str(name))

    def string(self, token: Token) -> Getter:
        return _constant(str(token)[1:-1].replace("''", "'"))

    def number(self, token: Token) -> Getter:
        return _constant(_number(str(token)))

    def negative(self, token: Token) -> Getter:
        return _constant(-_number(str(token)))

    def null(self) -> Getter:
        return _constant(None)

    def true(self) -> Predicate:
        return lambda tag, props: True

    def false(self) -> Predicate:
        return lambda tag, props: False

    def compare(self, left: Getter, op: Token, right: Getter) -> Predicate:
        symbol = str(op)
        return lambda tag, props: _compare(symbol, left(tag, props), right(tag, props))

    def is_null(self, value: Getter) -> Predicate:
        return lambda tag, props: value(tag, props) is None

    def is_not_null(self, value: Getter) -> Predicate:
        return lambda tag, props: value(tag, props) is not None

    def between(self, value: Getter, low: Getter, high: Getter) -> Predicate:
        def check(tag: str, props: Mapping[str, str]) -> bool | None:
            v = value(tag, props)
            return _and(_compare(">=", v, low(tag, props)), _compare("<=", v, high(tag, props)))

        return check

    def not_between(self, value: Getter, low: Getter, high: Getter) -> Predicate:
        inner = self.between(value, low, high)
        return lambda tag, props: _not(inner(tag, props))

    def in_(self, value: Getter, *choices: Getter) -> Predicate:
        options = [choice("", {}) for choice in choices]

        def check(tag: str, props: Mapping[str, str]) -> bool | None:
            v = value(tag, props)
            if v is None:
                return None
            # An OR of equalities: a NULL in the list makes a miss unknown, not false (so
            # `x NOT IN (1, NULL)` never matches, as SQL says).
            result: bool | None = False
            for option in options:
                equal = _compare("=", v, option)
                if equal:
                    return True
                if equal is None:
                    result = None
            return result

        return check

    def not_in(self, value: Getter, *choices: Getter) -> Predicate:
        inner = self.in_(value, *choices)
        return lambda tag, props: _not(inner(tag, props))

    def text_op(self, left: Getter, op: Token, right: Getter) -> Predicate:
        name = str(op).upper()
        return lambda tag, props: _text(name, left(tag, props), right(tag, props))

    def not_text_op(self, left: Getter, op: Token, right: Getter) -> Predicate:
        inner = self.text_op(left, op, right)
        return lambda tag, props: _not(inner(tag, props))

    def not_(self, inner: Predicate) -> Predicate:
        return lambda tag, props: _not(inner(tag, props))

    def and_(self, *terms: Predicate) -> Predicate:
        def check(tag: str, props: Mapping[str, str]) -> bool | None:
            result: bool | None = True
            for term in terms:
                result = _and(result, term(tag, props))
                if result is False:
                    return False
            return result

        return check

    def or_(self, *terms: Predicate) -> Predicate:
        def check(tag: str, props: Mapping[str, str]) -> bool | None:
            result: bool | None = False
            for term in terms:
                result = _or(result, term(tag, props))
                if result is True:
                    return True
            return result

        return check


_PREDICATES = frozenset(
    {"compare", "is_null", "is_not_null", "between", "not_between", "in_", "not_in",
     "text_op", "not_text_op", "not_", "and_", "or_", "true", "false"}
)  # fmt: skip


def _illegal(expression: str, why: str) -> RefusedError:
    shown = expression if len(expression) <= 80 else expression[:77] + "..."
    return RefusedError(
        Code.ILLEGAL_FILTER_EXPRESSION, f"illegal SQL92 filter expression {shown!r}: {why}"
    )


@functools.lru_cache(maxsize=4096)
def compile_sql92(expression: str) -> Callable[[str, Mapping[str, str]], bool]:
    """``matches(tag, properties)`` for an expression, or ILLEGAL_FILTER_EXPRESSION."""
    if not expression.strip():
        raise _illegal(expression, "it is empty")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise _illegal(expression, f"longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = _PARSER.parse(expression)
        if getattr(tree, "data", None) not in _PREDICATES:
            raise _illegal(expression, "it is a value, not a condition")
        if _depth(tree) > MAX_DEPTH:
            raise _illegal(expression, f"nested more than {MAX_DEPTH} levels deep")
        predicate: Predicate = _Compile().transform(tree)
    except RefusedError:
        raise
    except VisitError as exc:
        raise _illegal(expression, str(exc.orig_exc)) from None
    except LarkError as exc:
        raise _illegal(expression, _short(exc)) from None
    except RecursionError:
        raise _illegal(expression, "nested too deeply") from None
    return lambda tag, props: predicate(tag, props) is True


def _depth(tree: Tree[Token]) -> int:
    """The tree's depth, counted without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))
    return deepest


def _short(exc: LarkError) -> str:
    """The parser's complaint in one line (lark's messages span several)."""
    column = getattr(exc, "column", None)
    token = getattr(exc, "token", None)
    if token is not None and getattr(token, "type", "") == "$END":
        return "it ends too early"
    if token is not None and column is not None:
        return f"unexpected {str(token)!r} at column {column}"
    char = getattr(exc, "char", None)
    if char is not None and column is not None:
        return f"unexpected character {char!r} at column {column}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
