"""The one family of errors onnxlens raises on bad input.

Every error a user can cause is an `OnnxLensError`; the CLI prints its message on one line and
exits with `exit_code`, with no traceback (``--debug`` shows it). Messages name the node,
tensor or field at fault.
"""

from __future__ import annotations


class OnnxLensError(Exception):
    """Base class of every error caused by the user's input (model, flags, files)."""

    exit_code = 2


class ModelLoadError(OnnxLensError):
    """The file is missing, unreadable, truncated or not an ONNX model."""


class ExternalDataError(OnnxLensError):
    """An external-data reference is unsafe (leaves the model's folder) or inconsistent."""


class InvalidModelError(OnnxLensError):
    """The model parses but breaks a rule the analysis relies on (cycle, dangling input, ...)."""


class ShapeError(OnnxLensError):
    """A shape is impossible (negative, too large) or an input-shape flag does not fit."""


class UnsupportedOpError(OnnxLensError):
    """An op has no cost formula and the caller asked for --strict."""


class ExportError(OnnxLensError):
    """A framework model could not be built or exported to ONNX."""


class UsageError(OnnxLensError):
    """A flag or argument is malformed."""
