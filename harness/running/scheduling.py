"""Which worker runs what, and which shard holds what.

- ``CaseScheduling`` (pytest-xdist's scope scheduling over normdiff's scopes): every check of a
  case goes to one worker, so the agreement matrix compares every kernel that ran it; cases that
  share a kernel's compile key (``NormKernel.compile_key``) are kept in few workers; cases large
  enough to take GBs of GPU memory run in a few lanes per GPU; a crashed check is never re-run.
- ``shard_of`` (``--shard K/N``): deterministic, whole scopes, a benchmark group kept together.
"""
from __future__ import annotations

import re

import pytest

from harness.running import memory_watch
from harness.running.workers import LoadScopeScheduling
from harness.judging.shapes import HUGE_ELEMENTS

def case_groups(records: dict, cases: dict, kernels: dict, device_for) -> dict[str, str]:
    """case id -> group: cases joined when some kernel compiles once for both (union-find)."""
    parent: dict[str, str] = {}

    def find(a):
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    owner: dict = {}
    for rec in records.values():
        case, kernel = cases.get(rec.get("case")), kernels.get((rec.get("kernel"), rec.get("op")))
        if case is None or kernel is None:
            continue
        find(case.id)
        spec = case.spec(device_for(kernel))
        if kernel.unsupported(spec):
            continue
        key = kernel.compile_key(spec)
        if key is None:
            continue
        first = owner.setdefault((kernel.name, key), case.id)
        parent[find(case.id)] = find(first)
    return {c: find(c) for c in parent}


def weight(rec: dict | None, cases: dict) -> float:
    """Rough cost of a test, to balance workers and shards."""
    if not rec:
        return 1.0
    if str(rec.get("needs", "")).startswith("drawn"):  # many drawn cases in one check
        return 40.0
    case = cases.get(rec.get("case"))
    if case is None:
        return 1.0
    return 1.0 + numel(case) / 2**22


HEAVY_ELEMENTS = 2**25  # a case this large takes GBs of GPU memory (float64 oracle, guards, comparison)
# Workers that may hold such a case at once on one GPU: the largest (16384 x 8192) took 17 GB of
# the H200's 141 in one worker; four leave room for the other workers.
HEAVY_LANES_PER_GPU = 4
# Cases of HUGE_ELEMENTS or more (x alone 4-8 GiB, its snapshot and y as much again) all go to
# heavy lane 0: one at a time in the run.


def numel(case) -> int:
    n = 1
    for s in case.shape:
        n *= s
    return n


def scopes(ids: list[str], records: dict, cases: dict, kernels: dict, device_for, cap: float | None,
           heavy_lanes: int | None = None) -> dict[str, str]:
    """nodeid -> scheduling scope. A case's checks share a scope; cases sharing a compile key
    share one too, cut into pieces of at most ``cap`` weight (None: never cut). With
    ``heavy_lanes``, the cases of HEAVY_ELEMENTS or more go to that many scopes of their own, so
    at most that many workers hold one at a time (workers share a GPU's memory); those of
    HUGE_ELEMENTS or more all to lane 0, so at most one of them runs at a time."""
    groups = case_groups(records, cases, kernels, device_for)
    if heavy_lanes:  # largest first, each onto the lane with the fewest elements so far
        load = [0] * heavy_lanes
        for c in sorted((c for c in groups if numel(cases[c]) >= HEAVY_ELEMENTS), key=lambda c: (-numel(cases[c]), c)):
            lane = 0 if numel(cases[c]) >= HUGE_ELEMENTS else min(range(heavy_lanes), key=lambda i: (load[i], i))
            load[lane] += numel(cases[c])
            groups[c] = f"heavy lane {lane}"
    members: dict[str, list[str]] = {}
    for nid in ids:
        rec = records.get(nid) or {}
        if rec.get("case") in groups:
            members.setdefault(groups[rec["case"]], []).append(nid)
    out = {}
    for group, nids in members.items():
        # Cut between cases only, cases with the same shape kept adjacent.
        by_case: dict[str, list[str]] = {}
        for nid in nids:
            by_case.setdefault(records[nid]["case"], []).append(nid)
        order = sorted(by_case, key=lambda c: (str(cases[c].shape), cases[c].row_pad, c))
        piece, load = 0, 0.0
        for c in order:
            w = sum(weight(records[n], cases) for n in by_case[c])
            if cap is not None and load and load + w > cap and not group.startswith("heavy"):
                piece, load = piece + 1, 0.0
            load += w
            for n in by_case[c]:
                out[n] = f"case-group {group} #{piece}"
    for nid in ids:
        if nid in out:
            continue
        if nid.startswith("harness/"):
            out[nid] = nid  # independent: spread
        else:
            out[nid] = nid.rsplit("::", 1)[0]  # the framework's tests: by module, as xdist's loadscope
    return out


class CaseScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over normdiff's scopes, heaviest first; a crashed check is
    reported once and never re-run (its scope's other checks go to another worker)."""

    def __init__(self, config, log, state):
        super().__init__(config, log)
        self.state = state
        self.scope_of: dict[str, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        return self.scope_of.get(nodeid, nodeid)

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed and self._check_nodes_have_same_collection():
            ids = list(next(iter(self.registered_collections.values())))
            st = self.state
            total = sum(weight(st.records.get(n), st.case_index) for n in ids)
            cap = max(30.0, total / (3 * max(1, self.numnodes)))
            gpus = {(n.gateway.spec.env or {}).get("CUDA_VISIBLE_DEVICES") for n in self.nodes} - {None}
            self.scope_of = scopes(ids, st.records, st.case_index, st.kernel_index, st.device_for, cap,
                                   heavy_lanes=HEAVY_LANES_PER_GPU * len(gpus) if gpus else None)
            units: dict[str, dict[str, bool]] = {}
            for nid in ids:
                units.setdefault(self._split_scope(nid), {})[nid] = False
            cost = {s: sum(weight(st.records.get(n), st.case_index) for n in u) for s, u in units.items()}
            self.collection = ids
            for s in sorted(units, key=lambda s: -cost[s]):
                self.workqueue[s] = units[s]
            for node in self.nodes:
                if self.workqueue:
                    self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            return
        if self.collection is not None:  # a replacement worker finished collecting
            for node in self.nodes:
                self._reschedule(node)
            return
        super().schedule()

    def _reschedule(self, node) -> None:
        # A replacement worker is added before it has collected; xdist's loadscope would assign
        # it work then (KeyError when two workers die close together): it waits for its collection.
        if node not in self.registered_collections:
            return
        super()._reschedule(node)
        # A worker runs an item only once it holds the next one (or is told to shut down); a
        # replacement given one unit of one item (a check requeued after an out-of-memory) would
        # wait for ever: give it a second while there is one.
        while self.workqueue and not node.shutting_down and self._pending_of(self.assigned_work[node]) < 2:
            self._assign_work_unit(node)

    def remove_node(self, node):
        workload = self.assigned_work.pop(node)
        pending = [nid for unit in workload.values() for nid, done in unit.items() if not done]
        if not pending:
            return None
        crashitem = pending[0]
        controller = self.state.controller
        if controller is not None and memory_watch.retry_alone(controller, node.gateway.id, crashitem):
            crashitem = None  # an out-of-memory that broke the context: run again, alone (once)
        for unit in workload.values():
            unit.pop(crashitem, None)  # reported as crashed by the controller, never re-run
        self.workqueue.update({s: u for s, u in workload.items() if not all(u.values())})
        for other in list(self.assigned_work):
            self._reschedule(other)
        return crashitem


# -- shards -------------------------------------------------------------------------------------
def parse_shard(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", value.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise pytest.UsageError(f"--shard must be K/N with 1 <= K <= N, got {value!r}")
    return int(m.group(1)), int(m.group(2))


def shard_of(ids: list[str], records: dict, cases: dict, kernels: dict, device_for, count: int,
             groups: dict[str, str] | None = None) -> dict[str, int]:
    """nodeid -> shard (0-based): whole scopes, heaviest first onto the lightest shard. The
    same collection gives the same answer in every process. ``groups`` names the scope of tests
    that are not checks (a benchmark's group: its kernels are timed together)."""
    scope = {**scopes(ids, records, cases, kernels, device_for, cap=None), **(groups or {})}
    units: dict[str, list[str]] = {}
    for nid in ids:
        units.setdefault(scope[nid], []).append(nid)
    load = [0.0] * count
    out = {}
    for s in sorted(units, key=lambda s: (-sum(weight(records.get(n), cases) for n in units[s]), s)):
        k = min(range(count), key=lambda i: (load[i], i))
        load[k] += sum(weight(records.get(n), cases) for n in units[s])
        for n in units[s]:
            out[n] = k
    return out
