"""docs/result-schema.md, generated from the result's dataclasses and the tables of
harness/results/schema_fields.py; the schema's fingerprint and the rule that bumps its version.

    python -m harness.results.schema write      # rewrite docs/result-schema.md (harness-schema write)
    python -m harness.results.schema --check    # exit 1 when the page is stale
    python -m harness.results.schema --help     # what it does; writes nothing

The rule: `fingerprint()` digests every documented field and metric with its unit. When a
field is added, removed or renamed, or a unit changes, the fingerprint changes and
tests/unit/test_result_schema.py fails until SCHEMA (harness/results/run_result.py) is bumped and
the new fingerprint is recorded in SCHEMA_FINGERPRINTS below.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from harness.accounting.budget import Budget
from harness.common.interrupts import end_startup
from harness.common.keyvalue import did_you_mean, program_name
from harness.decode.decoding import ForwardRecord
from harness.results import schema_fields as f
from harness.results.run_result import SCHEMA, DecodedOutputs, RunIdentity, RunResult, Timing

PAGE = Path(__file__).resolve().parent.parent.parent / "docs" / "result-schema.md"

# schema version -> the fingerprint of its fields (version 1 had no documented fields)
# 3: cost breakdown, hardware estimates, calibration; 4: autoregressive phases (model families),
# DALI's measures, lock-step serving percentiles, GEM's profiling cost, requested_tokens (4 never
# landed before it was complete, so its fingerprint took the last of these); 5: versions.cpu_kernels;
# 7: dali's predicted_layers and horizon, gem_profiling_forwards
SCHEMA_FINGERPRINTS = {2: "e91c4d853643d06a", 3: "ebc498bae66d43fc", 4: "62c5cef9777989fe", 5: "051f9a55a955f477",
                       6: "09dafde9ad946ca1", 7: "63b2f33315308034",  # 7 also: routing_source generated
                       8: "3873ddece07d27e7",  # 8: serving with arrivals (queue_*, ttft_p*, serving_peak_running)
                       9: "6ac1663285f4de7f"}  # 9: prefetch_*_next_gate; _residual reads the residual channel

# (heading, dataclass or None, its table, what it describes)
RECORDS: list[tuple[str, type | None, Mapping[str, f.Entry], str]] = [
    ("Sections (RunResult)", RunResult, f.RESULT_FIELDS, "The sections of result.json."),
    ("Identity (RunIdentity)", RunIdentity, f.IDENTITY_FIELDS,
     "Top-level strings; backend, trace, replay, trace_derived_from, calibration, routing_source and hints only "
     "where set."),
    ("Timing (Timing)", Timing, f.TIMING_FIELDS, "`timing` in result.json is `kind`."),
    ("Decoded outputs (DecodedOutputs)", DecodedOutputs, f.DECODED_FIELDS, "Live runs only."),
    ("`budget` (Budget)", Budget, f.BUDGET_FIELDS, "The resolved budget (harness/accounting/budget.py)."),
    ("`steps` (ForwardRecord)", ForwardRecord, f.STEP_FIELDS, "One per forward of a live run."),
    ("`step_series`", None, f.STEP_SERIES_FIELDS,
     "One point per forward, live and replay (harness/accounting/ledger.py)."),
    ("`workload`", None, f.WORKLOAD_FIELDS, "harness/decode/workload.py `workload_record`."),
    ("`versions`", None, f.VERSIONS_FIELDS,
     "Software and machine (harness/job/setup.py, harness/common/machine.py)."),
]


def undocumented() -> list[str]:
    """Dataclass fields without an entry, and entries of no field ('Class.field')."""
    problems = []
    for _, cls, table, _ in RECORDS:
        if cls is None:
            continue
        names = {field.name for field in dataclasses.fields(cls)}
        problems += [f"{cls.__name__}.{n} has no entry in schema_fields.py" for n in sorted(names - set(table))]
        problems += [f"{cls.__name__}.{n} is documented but is no field" for n in sorted(set(table) - names)]
    return problems


def metric_entry(name: str) -> tuple[str, str, str] | None:
    """(unit, section, meaning) of a metric name, by name or by pattern."""
    if name in f.METRICS:
        return f.METRICS[name]
    return next((entry for pattern, entry in f.METRIC_PATTERNS.items() if re.fullmatch(pattern, name)), None)


def undocumented_metrics(names: Iterable[str]) -> list[str]:
    return sorted(n for n in set(names) if metric_entry(n) is None)


def fingerprint() -> str:
    """16 hex digits over every documented field and metric name with its unit."""
    items = [f"{heading}:{name}:{unit}" for heading, _, table, _ in RECORDS for name, (unit, _) in table.items()]
    items += [f"metric:{name}:{entry[0]}" for name, entry in {**f.METRICS, **f.METRIC_PATTERNS}.items()]
    return hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The page's markdown."""
    lines = [
        "# result.json: every field, its unit and meaning",
        "",
        "Generated by `python -m harness.results.schema write` from the result's dataclasses",
        "(harness/results/run_result.py) and harness/results/schema_fields.py; do not edit by hand",
        "(tests/unit/test_result_schema.py fails when this page is stale).",
        "",
        f"Schema version: **{SCHEMA}** (fingerprint `{fingerprint()}`). The version is bumped whenever",
        "a field or metric is added, removed or renamed, or its unit changes: the test compares the",
        "fingerprint of the documented fields with the one recorded for the current version",
        "(`SCHEMA_FINGERPRINTS` in harness/results/schema.py). Readers accept every version:",
        "a field a result lacks is absent (`started_at` before version 2, say).",
        "",
        "Units: GB = 1e9 bytes; \"(modeled)\" = charged by the cost model for the profile named in",
        "`hardware`, never measured; \"(wall)\" = this machine's clock; \"(measured)\" = a GPU's clock",
        "(backend=cuda).",
        "",
    ]
    for heading, _, table, about in RECORDS:
        lines += [f"## {heading}", "", about, "", "| field | unit | meaning |", "|---|---|---|"]
        lines += [f"| `{name}` | {_cell(unit)} | {_cell(meaning)} |" for name, (unit, meaning) in table.items()]
        lines.append("")
    lines += ["## `metrics`", "",
              "Every number of every section, flat (MLflow logs them as metrics, except the constants of",
              "`CONSTANT_METRICS`, logged as params). A system report's numbers appear only for that system.", "",
              "| metric | unit | reported by | meaning |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {_cell(unit)} | {_cell(section)} | {_cell(meaning)} |"
              for name, (unit, section, meaning) in f.METRICS.items()]
    lines += [f"| `{_cell(pattern)}` | {_cell(unit)} | {_cell(section)} | {_cell(meaning)} |"
              for pattern, (unit, section, meaning) in f.METRIC_PATTERNS.items()]
    return "\n".join(lines) + "\n"


COMMANDS = {"write": "rewrite docs/result-schema.md from the result's dataclasses",
            "--check": "exit 1 when docs/result-schema.md is stale (0 when up to date); writes nothing"}


def help_text(prog: str) -> str:
    return "\n".join([f"usage: {prog} write | --check", "",
                      "docs/result-schema.md, generated from the result's dataclasses and "
                      "harness/results/schema_fields.py",
                      "", *(f"  {name:<9} {what}" for name, what in COMMANDS.items()),
                      "", "Nothing is written unless asked: only `write` writes."])


def main(argv: list[str] | None = None) -> int:
    end_startup()  # the imports are done: Ctrl-C is the command's own from here
    args = sys.argv[1:] if argv is None else argv
    prog = program_name("python -m harness.results.schema")
    if any(a in ("-h", "--help", "help") for a in args):
        print(help_text(prog))
        return 0
    if args not in (["write"], ["--check"], ["check"]):
        given = " ".join(args)
        hint = did_you_mean(args[0], COMMANDS) if len(args) == 1 else ""
        print(f"error: {prog}: {'say what to do' if not args else f'unknown argument {given!r}'}{hint}: "
              f"write (rewrite docs/result-schema.md) or --check (see {prog} --help)", file=sys.stderr)
        return 2
    problems = undocumented()
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args != ["write"]:
        stale = not PAGE.is_file() or PAGE.read_text() != render()
        print(f"{PAGE} is {'stale: run python -m harness.results.schema write' if stale else 'up to date'}")
        return 1 if stale else 0
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
