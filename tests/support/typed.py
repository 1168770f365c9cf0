"""The example output schema of the typed-results tests (the v_typed_output vector's too):
an issue's label, a confidence from 0 to 1, and tags."""

from __future__ import annotations

from typing import Any

CLASSIFICATION: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["bug", "feature", "question"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["label", "confidence", "tags"],
    "additionalProperties": False,
}
