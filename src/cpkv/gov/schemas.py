"""Loading the JSON schemas from ``gov/schema/`` and validating documents against them (draft 2020-12)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from cpkv.gov.files import KINDS, rel_path, schema_path
from cpkv.gov.model import Problem, problem


def load_validators(root: Path) -> tuple[dict[str, Draft202012Validator], list[Problem]]:
    """One validator per kind (``rfc``, ``clause``, ``work``); a missing or broken schema is a problem."""
    validators, problems = {}, []
    for kind in KINDS:
        path = schema_path(root, kind)
        rel = rel_path(path, root)
        if not path.is_file():
            problems.append(problem(rel, "schema file is missing"))
            continue
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
            Draft202012Validator.check_schema(schema)
        except json.JSONDecodeError as exc:
            problems.append(problem(rel, f"invalid JSON: {exc}"))
            continue
        except SchemaError as exc:
            problems.append(problem(rel, f"not a valid draft 2020-12 schema: {exc.message}"))
            continue
        validators[kind] = Draft202012Validator(schema)
    return validators, problems


def _where(path: Any) -> str:
    """``deque(['content', 'checklist', 0, 'done'])`` -> ``content.checklist[0].done``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def schema_problems(validator: Draft202012Validator, doc: dict[str, Any], rel: str) -> list[Problem]:
    """Every schema violation of ``doc`` as ``rel: <field path>: <jsonschema message>``, sorted."""
    errors = sorted(validator.iter_errors(doc), key=lambda e: (_where(e.absolute_path), e.message))
    return [problem(rel, f"{_where(e.absolute_path)}: {e.message}") for e in errors]
