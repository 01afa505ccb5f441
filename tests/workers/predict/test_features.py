"""Cheap prompt features: length requests, code, lists, tables, questions, conversation turns."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.predict import features as features_module
from workers.predict.features import (
    FEATURE_NAMES,
    embedding_text,
    extract,
    extract_batch,
    full_text,
    num_user_turns,
    requested_words,
)


def features(prompt, num_prompt_tokens: int = 10) -> dict[str, float]:
    values = extract(prompt, num_prompt_tokens=num_prompt_tokens)
    assert values.shape == (len(FEATURE_NAMES),) and values.dtype == np.float32
    return dict(zip(FEATURE_NAMES, values.tolist(), strict=True))


@pytest.mark.parametrize(("text", "words"), [
    ("Describe Paris in 50 words.", 50),
    ("in under 100 words, explain entropy", 100),
    ("Write 3 paragraphs about tea", 270),
    ("Summarize this in two sentences.", 40),
    ("Write a 1,000-word essay on rivers", 1000),
    ("Give me 10 bullet points on safety", 150),
    ("List 5 ideas for a birthday party", 100),
    ("Write 3 short paragraphs and then 20 sentences", 400),  # the largest request wins
])
def test_explicit_length_requests_become_words(text: str, words: float) -> None:
    assert requested_words(text) == pytest.approx(words)
    f = features(text)
    assert f["has_length_request"] == 1.0
    assert f["log_requested_words"] == pytest.approx(math.log1p(words), rel=1e-6)


@pytest.mark.parametrize("text", [
    "What is 2+2?", "I have 3 kids and 2 dogs, what car fits us?", "Step 1: open the lid.",
    "Write a function that returns the name of the day",
])
def test_numbers_without_a_size_unit_are_not_length_requests(text: str) -> None:
    assert requested_words(text) is None
    assert features(text)["has_length_request"] == 0.0


def test_code_prompts() -> None:
    pasted = "Why does this fail?\n```python\ndef f(x):\n    return x[0]\n```\n" \
             "And this?\n```js\nconst a = {};\n```"
    f = features(pasted)
    assert f["num_code_blocks"] == 2.0
    assert f["code_line_share"] > 0.3
    assert features("Write a Python function that reverses a list")["asks_code"] == 1.0
    assert features("Implement quicksort in Rust")["asks_code"] == 1.0
    assert features("Tell me a story about a cat")["asks_code"] == 0.0


def test_instruction_flags() -> None:
    assert features("Briefly explain TCP")["asks_brief"] == 1.0
    assert features("Explain TCP in detail, step by step")["asks_detail"] == 1.0
    assert features("List the planets")["asks_list"] == 1.0
    assert features("Make a markdown table of prices")["asks_table"] == 1.0
    assert features("Write an essay about Rome")["asks_long_form"] == 1.0
    assert features("Write a haiku about rain")["asks_short_form"] == 1.0
    assert features("Summarize the text below")["asks_summary"] == 1.0
    assert features("Compare Python vs Go")["asks_compare"] == 1.0
    assert features("Solve x^2 = 4")["asks_math"] == 1.0
    assert features("continue")["is_continuation"] == 1.0
    rewrite = features("Please rewrite this paragraph to sound formal: ...", 200)
    assert rewrite["asks_rewrite"] == 1.0
    assert rewrite["rewrite_log_tokens"] == pytest.approx(math.log1p(200), rel=1e-6)
    plain = features("Tell me about owls")
    assert plain["asks_rewrite"] == 0.0 and plain["rewrite_log_tokens"] == 0.0


def test_question_words() -> None:
    assert features("What is a monad?")["starts_wh_question"] == 1.0
    assert features("How do I bake bread?")["starts_wh_question"] == 1.0
    assert features("Is the earth round?")["starts_yes_no_question"] == 1.0
    assert features("Write a poem.")["starts_wh_question"] == 0.0
    assert features("Why? Why not? Really?")["num_question_marks"] == 3.0


def test_chat_prompts_use_the_last_user_turn_and_count_turns() -> None:
    chat = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Now write 2 paragraphs about it."},
    ]
    assert num_user_turns(chat) == 2
    assert embedding_text(chat) == "Now write 2 paragraphs about it."
    assert "You are terse." in full_text(chat) and "Apple." in full_text(chat)
    f = features(chat, num_prompt_tokens=30)
    assert f["num_user_turns"] == 2.0
    assert f["log_requested_words"] == pytest.approx(math.log1p(180), rel=1e-6)
    assert f["log_prompt_tokens"] == pytest.approx(math.log1p(30), rel=1e-6)
    assert features("plain text")["num_user_turns"] == 1.0
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}]
    assert embedding_text(parts) == "Hi there"


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        extract("hello", num_prompt_tokens=-1)
    with pytest.raises(ValueError):
        extract([], num_prompt_tokens=0)


def test_batch_counts_tokens_of_the_whole_conversation(counter) -> None:
    prompts = ["Hello world", [{"role": "user", "content": "Hello"},
                               {"role": "assistant", "content": "world"},
                               {"role": "user", "content": "again"}]]
    batch = extract_batch(prompts, counter)
    assert batch.shape == (2, len(FEATURE_NAMES))
    column = FEATURE_NAMES.index("log_prompt_tokens")
    assert batch[0, column] == pytest.approx(math.log1p(counter("Hello world")))
    assert batch[1, column] == pytest.approx(math.log1p(counter("Hello\n\nworld\n\nagain")))
    assert extract_batch([], counter).shape == (0, len(FEATURE_NAMES))


def test_token_counter_counts_qwen_tokens(counter) -> None:
    assert counter("") == 0
    assert 1 <= counter("Hello world") <= 3
    assert counter("<|im_end|>") > 1  # special-token text in a prompt is plain text


# The phrases' fast path (lowered ASCII text, case-sensitive search) must find exactly what the
# case-insensitive search finds: the trained heads were fitted on the latter.
_PHRASES = [value for value in vars(features_module).values()
            if isinstance(value, features_module._Phrases)]
_WORDS = sorted({word for phrases in _PHRASES
                 for word in re.findall(r"[a-z][a-z ;\-]*[a-z]", phrases.any_case.pattern)})
_ASCII_TEXT = st.lists(
    st.one_of(st.sampled_from(_WORDS), st.sampled_from(["50", "3", "?", ".", "\n", "-", "  "]),
              st.text(alphabet=st.characters(max_codepoint=127), max_size=6)),
    max_size=30,
).flatmap(lambda parts: st.tuples(st.just(parts), st.lists(st.booleans(), min_size=len(parts),
                                                             max_size=len(parts))))


def _cased(parts_and_flips: tuple[list[str], list[bool]]) -> str:
    parts, flips = parts_and_flips
    return " ".join(part.upper() if flip else part.title() if len(part) % 2 else part
                    for part, flip in zip(parts, flips, strict=True))


@settings(max_examples=300, deadline=None)
@given(_ASCII_TEXT.map(_cased))
def test_the_lowered_search_of_ascii_text_finds_what_the_case_insensitive_one_finds(
        text: str) -> None:
    fast, reference = features_module._Text.of(text), features_module._Text(text, None)
    assert fast.lowered is not None
    for phrases in _PHRASES:
        assert fast.has(phrases) == reference.has(phrases), phrases.any_case.pattern[:60]
        assert ([m.span() for m in fast.finditer(phrases)]
                == [m.span() for m in reference.finditer(phrases)])
    assert features_module._requested_words(fast) == features_module._requested_words(reference)


def test_a_phrase_pattern_must_be_written_in_lower_case() -> None:
    with pytest.raises(ValueError, match="lower case"):
        features_module._Phrases(r"\bSELECT\b")
    features_module._Phrases(r"(?P<unit>\w+)\S")  # escapes and group names are not words


def test_non_ascii_text_takes_the_case_insensitive_search() -> None:
    f = features("Écris un ESSAY de 3 PARAGRAPHS, s'il te plaît, en DÉTAIL")
    assert f["asks_long_form"] == 1.0 and f["has_length_request"] == 1.0
    assert f["non_ascii_share"] == pytest.approx(3 / 56)
