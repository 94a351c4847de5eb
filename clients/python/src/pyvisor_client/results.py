"""What the daemon answers, as Python objects: the result of an execution and its rich
output. Every other method's answer is the plain JSON object (a dict or a list) that
docs/protocol.md describes.
"""

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .errors import EXECUTION_ERRORS


@dataclass
class Display:
    """One rich output: `data` is base64 text for image/png, plain text for other types."""

    mime: str
    data: str

    def bytes(self):
        """The content as bytes: decoded from base64 for image/png, else UTF-8."""
        if self.mime == "image/png":
            return base64.b64decode(self.data)
        return self.data.encode("utf-8")


@dataclass
class ExecutionResult:
    """The result of ``session.execute`` (docs/protocol.md)."""

    execution_id: str
    execution_count: int
    status: str
    stdout: str = ""
    stderr: str = ""
    result: Optional[Dict[str, Any]] = None
    display: List[Display] = field(default_factory=list)
    error: Optional[Dict[str, Any]] = None
    duration_ms: float = 0.0
    from_cache: bool = False
    recovered: Optional[Dict[str, Any]] = None
    warnings: List[str] = field(default_factory=list)
    insights: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, obj):
        """The result from its JSON object; fields the client does not know are left out."""
        known = {name: obj[name] for name in cls.__dataclass_fields__ if name in obj}
        known["display"] = [Display(item["mime"], item["data"])
                            for item in obj.get("display") or []]
        return cls(**known)

    @property
    def ok(self):
        return self.status == "ok"

    @property
    def value(self):
        """The repr of the final expression's value, or None."""
        return self.result["repr"] if self.result else None

    def raise_for_status(self):
        """Raises the ExecutionError subclass of the status unless it is ``ok``; returns self."""
        if self.status != "ok":
            raise EXECUTION_ERRORS.get(self.status, EXECUTION_ERRORS["error"])(self)
        return self
