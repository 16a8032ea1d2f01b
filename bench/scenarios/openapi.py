"""openapi: schemathesis fuzzes the embed plugin from its own GET /openapi.json, long.

The same run as tests/openapi.rs (same checks, tests/openapi/schemathesis.toml, seed 26), with
many more examples per operation: m0serve --plugin embed (all-MiniLM-L6-v2, one worker,
unpinned) and schemathesis on 127.0.0.1. Reports, per route, the requests the server logged
and their statuses (from its access log), the test cases schemathesis generated and the
failures it found (zero expected), and how often a worker started (once: none died).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter

import harness as h

TITLE = "openapi — schemathesis against the embed plugin's /openapi.json"
ABOUT = ("Property-based fuzzing of every documented route from the served OpenAPI document: "
         "no 5xx, every response as documented, the worker never dies.")
NEEDS = ["m0serve", "openapi"]
PORT = 18260
SEED = "26"
EXAMPLES = 2000          # per operation; --quick: 50
# As tests/openapi.rs: every check about one response and the document.
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_headers_conformance,response_schema_conformance,negative_data_rejection,"
          "positive_data_acceptance,missing_required_header,unsupported_method,"
          "allow_header_conformance")


def _access(log: str) -> tuple[Counter, dict[str, Counter]]:
    """Requests per `METHOD /path` and their status classes, from the access log lines."""
    routes: Counter = Counter()
    classes: dict[str, Counter] = {}
    for line in log.splitlines():
        if '] "' not in line:
            continue
        request, _, rest = line.split('] "', 1)[1].partition('" ')
        status = rest.split(" ", 1)[0]
        if not status.isdigit():
            continue
        target = request.rsplit(" ", 1)[0]
        routes[target] += 1
        classes.setdefault(target, Counter())[status[0] + "xx"] += 1
    return routes, classes


def run(opts) -> h.Report:
    venv = h.extra_venv("openapi")
    examples = 50 if opts.quick else EXAMPLES
    server = h.Server("m0serve embed", ["{m0serve}", "--plugin", "embed", "--venv", str(venv),
                                        "--host", "127.0.0.1", "--port", "{port}",
                                        "--workers", "1", "--access-log", "-"],
                      cpus=None, start_timeout=60.0)
    outdir = h.server_dir(server)
    report_path = outdir / "schemathesis.json"
    report_path.unlink(missing_ok=True)
    run_ = h.start(server, PORT)
    try:
        status, body = h.http_get(PORT, "/openapi.json")
        if status != 200:
            raise h.BenchError(f"GET /openapi.json gave {status}")
        (outdir / "openapi.json").write_bytes(body)
        argv = [str(venv / "bin" / "schemathesis"),
                "--config-file", str(h.ROOT / "tests" / "openapi" / "schemathesis.toml"),
                "--no-color", "run", f"http://127.0.0.1:{PORT}/openapi.json",
                "--seed", SEED, "--max-examples", str(examples), "--workers", "2",
                "--checks", CHECKS, "--report", "json", "--report-json-path", str(report_path)]
        h.log(f"schemathesis: {examples} examples per operation, seed {SEED}")
        out = subprocess.run(argv, capture_output=True, text=True, cwd=outdir,
                             env={**os.environ,
                                  "HYPOTHESIS_STORAGE_DIRECTORY": str(outdir / "hypothesis")})
        (outdir / "schemathesis.out").write_text(out.stdout + out.stderr)
    finally:
        h.stop(run_)
    if not report_path.exists():
        raise h.BenchError(f"schemathesis wrote no report:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    report = json.loads(report_path.read_text())
    # This run's part of the log: h.start appends, after a `$ argv` line.
    log = run_.logpath.read_text(errors="replace").rpartition("\n$ ")[2]
    routes, classes = _access(log)
    starts = sum(1 for l in log.splitlines()
                 if "supervisor: worker " in l and l.endswith(" started"))
    # The document's operations (GET /openapi.json among them: schemathesis loads it).
    try:
        doc = json.loads((outdir / "openapi.json").read_text())
    except (OSError, ValueError):
        raise h.BenchError("the server's /openapi.json was not saved") from None
    documented = [f"{m.upper()} {p}" for p, item in doc["paths"].items() for m in item]
    rows = []
    for op in documented:
        c = classes.get(op, Counter())
        rows.append([f"`{op}`", str(routes[op]), str(c["2xx"]), str(c["4xx"]), str(c["5xx"])])
    paths = {op.split(" ", 1)[1] for op in documented}
    probes = [op for op in routes if op not in documented and op.partition(" ")[2] in paths]
    other = Counter()
    for op in probes:
        other.update(classes[op])
    rows.append(["other methods on those paths (405 checks)", str(sum(routes[o] for o in probes)),
                 str(other["2xx"]), str(other["4xx"]), str(other["5xx"])])
    failures = report.get("failures") or []
    cases = report["test_cases"]
    five = sum(c["5xx"] for c in classes.values())
    return h.Report(TITLE, ["request", "requests", "2xx", "4xx", "5xx"], rows,
                    setup=[f"schemathesis {report['schemathesis_version']}, seed {SEED}, "
                           f"`--max-examples {examples}` per operation, 2 client workers, "
                           f"checks `{CHECKS}`; m0serve --plugin embed --workers 1 unpinned.",
                           "Requests counted from the server's access log (schemathesis also "
                           "sends each route the methods it does not take, for the 405 checks)."],
                    notes=[f"Test cases generated: {cases['generated']}; with failures: "
                           f"{cases['with_failures']}; schemathesis errors: "
                           f"{len(report.get('errors') or [])}; exit code {out.returncode}; "
                           f"{report['running_time']:.0f} s.",
                           "Failures: " + ("none" if not failures else "; ".join(
                               f"{f['type']} on {', '.join(f['operations'])}" for f in failures)),
                           f"Operations tested: {report['operations']['tested']} of "
                           f"{report['operations']['total']} (the document's own GET is how "
                           f"schemathesis loads it); responses 5xx: {five}; worker starts: "
                           f"{starts} (1 = none died)."])
