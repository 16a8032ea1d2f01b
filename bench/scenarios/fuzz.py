"""fuzz: the differential fuzz harness of tests/fuzz_http.rs, run long.

The test generates requests from a grammar of real and hostile parts and
mutations of them (flipped, inserted, removed and repeated bytes, cuts),
frames each with m0serve's parser and chunked decoder, and asks h11 (the
strict parser pinned in tests/requirements-fuzz.txt) how it frames the same
bytes. A finding is a request we accept that h11 refuses, or frame, or
decode, differently; refusing what h11 accepts is counted, not a finding.
CI runs 4,000 cases of one seed; this runs SEEDS seeds of CASES cases each,
built with --release so the cases are cheap.
"""

import os
import re
import subprocess
import time

import harness as h

TITLE = "fuzz — the request parser and chunked decoder against h11, differentially"
ABOUT = ("Requests from a grammar and its mutations, framed by m0serve's parser and by h11: "
         "every request we accept must be one h11 accepts and frames alike.")
TARGET = "0 findings."
NEEDS = ["m0serve"]
SEEDS = [11, 13, 17, 19, 23]
CASES = 200_000

LINE = re.compile(r"fuzz: seed (\S+): (\d+) cases, (\d+) framed alike, (\d+) refused by both, "
                  r"(\d+) refused by us only, (\d+) incomplete for both, (\d+) finding")


def run(opts) -> h.Report:
    seeds = SEEDS[:2] if opts.quick else SEEDS
    cases = 20_000 if opts.quick else CASES
    rows, total, findings = [], 0, 0
    for seed in seeds:
        env = dict(os.environ, M0_FUZZ_SEED=str(seed), M0_FUZZ_CASES=str(cases))
        t0 = time.perf_counter()
        out = subprocess.run(
            ["cargo", "test", "-q", "--release", "--test", "integration", "fuzz_http::",
             "--", "--nocapture"],
            cwd=h.ROOT, env=env, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        m = LINE.search(out.stderr + out.stdout)
        if not m:
            raise h.BenchError(f"seed {seed}: no summary line\n{out.stderr[-3000:]}")
        n, alike, both, ours, need, found = (int(x) for x in m.groups()[1:])
        total += n
        findings += found
        rows.append([str(seed), f"{n:,}", f"{alike:,}", f"{both:,}", f"{ours:,}", f"{need:,}",
                     str(found), f"{dt:.1f} s"])
        h.log(f"seed {seed}: {n:,} cases, {found} finding(s), {dt:.1f} s")
    return h.Report(
        TITLE,
        ["seed", "cases", "framed alike", "refused by both", "refused by us only",
         "incomplete for both", "findings", "wall (build, h11 and compare)"],
        rows,
        setup=[f"`cargo test --release --test integration fuzz_http::` with M0_FUZZ_SEED and "
               f"M0_FUZZ_CASES={cases:,}; h11 from tests/requirements-fuzz.txt."],
        notes=[f"Total: {total:,} cases, {findings} finding(s). "
               + ("Target met." if findings == 0 else "**Target not met**: see the test's output."),
               "Findings this harness made, each now a unit test: `Transfer-Encoding: identity, "
               "chunked` was accepted (now 501), empty list elements in Transfer-Encoding were "
               "skipped (now 400), and trailer lines that are not field lines were skipped "
               "(now 400)."])
