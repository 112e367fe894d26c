"""The library's messages in the caller's words.

The C++ library names the arguments of its own API (``k_start``, ``kv_scales``, ``seq_len_kv``,
``logits``, ...); each Python function spells them its own way (DeepGEMM's names). Its calls into
the extension run inside ``with vocabulary:``, which rewrites a refusal's message with the
function's :class:`Vocabulary`: the argument the message starts with becomes the Python
argument, and C++ names in the rest of the message become the caller's words. The C++ library
is unchanged.
"""

from __future__ import annotations

import re
from typing import Mapping

# Operands a function takes as a tensor or a (values, scales) pair; their scales have no
# argument of their own in Python.
_PAIRED = ("q", "kv")
# Element type names of the C++ library that the frameworks spell differently.
_DTYPE_TERMS = {"float8_e4m3": "float8_e4m3fn"}


class InvalidArgumentError(ValueError, RuntimeError):
    """An input refused before anything runs (shape, stride, alignment, device, range, ...).

    A ValueError, and a RuntimeError too: DeepGEMM raises RuntimeError for every refusal, so code
    written against it (``except RuntimeError``) catches ours as well."""


class InvalidTypeError(TypeError, RuntimeError):
    """An argument of the wrong Python type or dtype: a TypeError, and a RuntimeError as
    DeepGEMM's refusals are."""


class Vocabulary:
    """How one Python function words the library's messages; the calls into the extension run
    inside ``with vocabulary:``, which re-raises the library's ValueError / TypeError with the
    message rephrased, as InvalidArgumentError / InvalidTypeError. One object per function,
    built once: entering it costs a call nothing (a generator-based context manager would add
    a generator's set-up to every call)."""

    __slots__ = ("arguments", "terms")

    def __init__(self, arguments: Mapping[str, str], terms: Mapping[str, str]):
        self.arguments = arguments  # C++ argument a message starts with -> the Python argument
        self.terms = terms          # a C++ name in the rest of a message -> the caller's words

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is not None and issubclass(kind, TypeError):
            raise InvalidTypeError(rephrase(str(error), self)) from None
        if kind is not None and issubclass(kind, ValueError):
            raise InvalidArgumentError(rephrase(str(error), self)) from None
        return False


def _replace_words(text: str, words: Mapping[str, str]) -> str:
    for old, new in words.items():
        # Whole names only: `k_start` inside `cu_seq_len_k_start` or `get_num_sms()` stays.
        text = re.sub(rf"(?<![\w.]){re.escape(old)}(?![\w(])", new, text)
    return text


def rephrase(message: str, vocabulary: Vocabulary) -> str:
    """A library message ("argument: what was expected, what was given") in Python's words."""
    argument, separator, detail = message.partition(": ")
    if not separator or " " in argument:
        return _replace_words(message, {**_DTYPE_TERMS, **vocabulary.terms})
    detail = _replace_words(detail, {**_DTYPE_TERMS, **vocabulary.terms})
    operand = argument[:-len("_scales")] if argument.endswith("_scales") else None
    if operand in _PAIRED:
        if detail.endswith("got none"):
            return f"{operand}: pass (values, scales): {detail}"
        return f"{operand}: scales ({operand}[1]): {detail}"
    return f"{vocabulary.arguments.get(argument, argument)}: {detail}"
