"""Symbolic ranks: the same programs at real sizes, arrays with shapes and dtypes but no values."""

from .array import SymArray, SymbolicValueError

__all__ = ["SymArray", "SymbolicValueError"]
