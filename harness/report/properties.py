"""The correctness report's sections on determinism and batch invariance (harness.judging.properties),
from the records of ``test_deterministic``, ``test_batch_invariant``, their backward twins and the
fused family's (harness/test_fused_properties.py)."""
from __future__ import annotations

from collections import defaultdict

# Each check's record, and what a kernel's row is labelled with: the plain and fused families.
DETERMINISM = {"test_deterministic": "", "test_backward_deterministic": " (backward)", "test_fused_deterministic": "",
               "test_fused_backward_deterministic": " (backward)"}
BATCH = {"test_batch_invariant": "", "test_backward_batch_invariant": " (backward: dx)", "test_fused_batch_invariant": "",
         "test_fused_backward_batch_invariant": " (backward: dx)"}


def render(records: list[dict], table) -> list[str]:
    lines = []
    det = [r for r in records if r.get("test") in DETERMINISM and "deterministic" in r]
    if det:
        by_kernel: dict[str, list] = defaultdict(list)
        for r in det:
            by_kernel[r["kernel"] + DETERMINISM[r["test"]]].append(r)
        lines += ["", "## Determinism", "",
                  "Two calls on identical inputs into fresh outputs, compared bit for bit (y, mean, rstd; for "
                  "a backward, two backward calls on one forward's statistics: dx, dw, db).", ""]
        rows = []
        for k, rs in sorted(by_kernel.items()):
            bad = [r for r in rs if not r["deterministic"]]
            worst = max((d["max_ulps"] for r in bad for d in r.get("bit_diffs", ())), default=0)
            verdict = "deterministic" if not bad else (
                "declared nondeterministic" if any(r.get("outcome") == "known issue" for r in bad) else "**nondeterministic**")
            rows.append([k, len(rs), len(bad), f"{worst} ulp" if bad else "-", bad[0]["case"] if bad else "-", verdict])
        lines += table(["kernel", "cases", "cases whose bits differ", "largest difference", "first such case", "verdict"], rows)
    bat = [r for r in records if r.get("test") in BATCH and "batch_invariant" in r]
    if bat:
        by_kernel = defaultdict(list)
        for r in bat:
            by_kernel[r["kernel"] + BATCH[r["test"]]].append(r)
        lines += ["", "## Batch invariance", "",
                  "Sample rows of each case recomputed alone and in batches of other sizes, at other positions, "
                  "compared bit for bit with the same rows in the full call (a backward: dx, from the same rows' x, dy "
                  "and saved statistics). *Claim*: what the kernel declares (`NormKernel.batch_invariant`, "
                  "`backward_batch_invariant`; a claimed invariance that breaks fails).", ""]
        rows = []
        for k, rs in sorted(by_kernel.items()):
            changes: dict[int, set] = defaultdict(set)
            for r in rs:
                for m, outputs in (r.get("batch_changes") or {}).items():
                    changes[int(m)].update(outputs)
            variant = [r for r in rs if not r["batch_invariant"]]
            claim = {True: "invariant", False: "variant", None: "unknown"}[rs[0].get("batch_claim")]
            where = ", ".join(f"{m} ({'/'.join(sorted(o))})" for m, o in sorted(changes.items())) or "-"
            sizes = sorted({s for r in rs for s in r.get("batch_sizes", ())})
            rows.append([k, claim, "no" if variant else "yes", f"{len(variant)} of {len(rs)}", where,
                         ", ".join(map(str, sizes))])
        lines += table(["kernel", "claim", "batch-invariant here", "cases with a change", "M where bits change (outputs)",
                        "batch sizes"], rows)
    return lines
