"""The SQL92 parser under fuzzing: any text either compiles or is refused with
ILLEGAL_FILTER_EXPRESSION (never another exception), and what compiles evaluates without
raising on any properties. Generated well-formed expressions compile and agree with a
reference evaluation built alongside them."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.sql92 import compile_sql92
from support.examples import examples

TOKENS = [
    "a", "b", "TAGS", "x.y", "$p", "'s'", "'it''s'", "''", "1", "-2", "3.5", "1e3", "07",
    "=", "<>", ">", ">=", "<", "<=", "AND", "or", "Not", "IS", "NULL", "BETWEEN", "IN", "(",
    ")", ",", "TRUE", "false", "CONTAINS", "STARTSWITH", "ENDSWITH", "*", "'", "==", "!",
]  # fmt: skip

PROPS = st.dictionaries(
    st.sampled_from(["a", "b", "x.y", "$p"]),
    st.one_of(st.text(max_size=5), st.integers(-5, 5).map(str), st.floats().map(str)),
)


def _refused_cleanly(expression: str) -> None:
    with pytest.raises(RefusedError) as err:
        compile_sql92(expression)
    assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=14), PROPS, st.sampled_from(["", "TagA"]))
def test_token_soup_compiles_or_is_refused(tokens: list[str], props, tag: str) -> None:
    expression = " ".join(tokens)
    try:
        matches = compile_sql92(expression)
    except RefusedError as err:
        assert err.code == Code.ILLEGAL_FILTER_EXPRESSION
        return
    assert matches(tag, props) in (True, False)


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_compiles_or_is_refused(text: str) -> None:
    try:
        compile_sql92(text)
    except RefusedError as err:
        assert err.code == Code.ILLEGAL_FILTER_EXPRESSION


# Well-formed expressions, each with its reference: (text, fn(props) -> True/False/None).
def _cmp(op: str, value: int):
    ops = {"=": int.__eq__, "<>": int.__ne__, ">": int.__gt__, ">=": int.__ge__,
           "<": int.__lt__, "<=": int.__le__}  # fmt: skip

    def ref(props):
        raw = props.get("a")
        return None if raw is None else ops[op](int(raw), value)

    return (f"a {op} {value}", ref)


def _not(inner):
    text, ref = inner

    def neg(props):
        value = ref(props)
        return None if value is None else not value

    return (f"NOT ({text})", neg)


def _and(left, right):
    def both(props):
        a, b = left[1](props), right[1](props)
        if a is False or b is False:
            return False
        return None if a is None or b is None else True

    return (f"({left[0]}) AND ({right[0]})", both)


def _or(left, right):
    def either(props):
        a, b = left[1](props), right[1](props)
        if a is True or b is True:
            return True
        return None if a is None or b is None else False

    return (f"({left[0]}) OR ({right[0]})", either)


LEAVES = st.builds(_cmp, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), st.integers(-3, 3))
EXPRESSIONS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.builds(_not, children),
        st.builds(_and, children, children),
        st.builds(_or, children, children),
    ),
    max_leaves=12,
)


@settings(max_examples=examples(150), deadline=None)
@given(EXPRESSIONS, st.one_of(st.none(), st.integers(-4, 4)))
def test_generated_expressions_agree_with_the_reference(expression, a) -> None:
    text, reference = expression
    props = {} if a is None else {"a": str(a)}
    assert compile_sql92(text)("", props) == (reference(props) is True), text


@pytest.mark.parametrize("value", ["1_000", "1_0.5", "1_0e1", "-1_0"])
def test_a_property_with_underscores_is_no_number(value: str) -> None:
    """Python reads "1_000" as 1000; RocketMQ's SQL92 (Java's Long and Double parsing) takes
    no underscores, so such a property is no number: comparing it with one is unknown."""
    for expression in ("a = 1000", "a = 10", "a >= 0", "a < 0", "a BETWEEN 0 AND 100000"):
        assert compile_sql92(expression)("", {"a": value}) is False, (expression, value)
    assert compile_sql92(f"a = '{value}'")("", {"a": value}) is True


@pytest.mark.parametrize(
    ("expression", "a", "matches"),
    [
        ("a IN (1, NULL)", "1", True),
        ("a IN (1, NULL)", "2", False),  # unknown
        ("a NOT IN (1, NULL)", "2", False),  # unknown, not TRUE
        ("a NOT IN (1, NULL)", "1", False),
        ("NOT (a IN (1, NULL))", "2", False),
        ("a NOT IN (1, 3)", "2", True),
        ("a IN (1, NULL) OR a = 2", "2", True),
    ],
)
def test_in_with_a_null_in_the_list_is_unknown_on_a_miss(
    expression: str, a: str, matches: bool
) -> None:
    """SQL's IN is an OR of equalities: a value not in the list, with a NULL in it, is
    unknown, so NOT IN does not match either."""
    assert compile_sql92(expression)("", {"a": a}) is matches
