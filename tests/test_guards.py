"""Guards: the poison is a NaN no arithmetic makes; unwritten elements and stray writes are found
and located."""
import pytest
import torch

from harness.judging import guards
from tests.planted import Correct


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_poison_is_a_nan_that_arithmetic_does_not_produce(dtype):
    out, guarded = guards.guarded_outputs(Correct("rms_norm"), torch.empty(3, 5, dtype=dtype))
    assert torch.isnan(out.y).all()
    computed = (torch.zeros(4, dtype=dtype) / 0).view(guards._INT_VIEW[dtype.itemsize])
    assert not (computed == guards.POISON_BITS[dtype]).any()


def test_clean_write_has_no_findings_and_a_missed_element_is_located():
    x = torch.randn(2, 3, 7)
    out, guarded = guards.guarded_outputs(Correct("layer_norm"), x)
    out.y.copy_(x)
    out.mean.fill_(0)
    out.rstd.fill_(1)
    assert guards.inspect(guarded) == []
    out.y[1, 2, 4] = float("nan")  # a computed NaN is a write, not poison
    assert guards.inspect(guarded) == []
    out.y[1, 2, 4:5].view(torch.int32).fill_(guards.POISON_BITS[torch.float32])  # as if never written
    (finding,) = guards.inspect(guarded)
    assert (finding.output, finding.kind, finding.count, finding.first) == ("y", "unwritten", 1, [1, 2, 4])


def test_writes_between_rows_and_past_the_end_are_out_of_bounds():
    x = torch.randn(4, 8)
    out, guarded = guards.guarded_outputs(Correct("rms_norm"), x)
    out.y.copy_(x)
    out.rstd.fill_(1)
    gap_column = out.y.as_strided((4, 9), (out.y.stride(0), 1))
    gap_column[1, 8] = 0.0  # one past the end of row 1
    out.rstd.as_strided((5,), (1,))[4] = 0.0  # one past the end of rstd
    findings = {(f.output, f.kind): f for f in guards.inspect(guarded)}
    assert findings[("y", "out-of-bounds write")].first == [1 * out.y.stride(0) + 8]
    assert findings[("rstd", "out-of-bounds write")].first == [4]


def test_inputs_written_by_a_kernel_are_found():
    x = torch.randn(3, 4)
    before = guards.snapshot_inputs({"x": x})
    x[2, 1] = 0.5
    (finding,) = guards.inputs_modified(before, {"x": x})
    assert (finding.output, finding.kind, finding.first) == ("x", "input modified", [2, 1])


def test_chunked_inspection_finds_the_same_as_one_pass(monkeypatch):
    """Guards scan their buffers CHUNK_ELEMENTS at a time (a 2**31-element output would need GBs of
    masks): the counts and first positions do not depend on the chunk size."""
    def findings():
        x = torch.randn(5, 2, 7)
        out, guarded = guards.guarded_outputs(Correct("layer_norm"), x)
        out.y.copy_(x)
        out.mean.fill_(0)
        out.rstd.fill_(1)
        out.y[3, 1, 2:4].view(torch.int32).fill_(guards.POISON_BITS[torch.float32])
        out.y[4, 0, 6:7].view(torch.int32).fill_(guards.POISON_BITS[torch.float32])
        out.y.as_strided((10, 8), (out.y.stride(1), 1))[6, 7] = 0.0  # past row 6's end
        guarded[0].buffer[-1] = 1.0  # the tail canary
        before = guards.snapshot_inputs({"x": x})
        x[4, 1, 3] = 9.0
        x[1, 0, 0] = 9.0
        return guards.inspect(guarded) + guards.inputs_modified(before, {"x": x})

    whole = findings()
    monkeypatch.setattr(guards, "CHUNK_ELEMENTS", 3)
    chunked = findings()
    assert chunked == whole
    by_kind = {f.kind: f for f in whole}
    assert (by_kind["unwritten"].count, by_kind["unwritten"].first) == (3, [3, 1, 2])
    assert by_kind["out-of-bounds write"].count == 2
    assert (by_kind["input modified"].count, by_kind["input modified"].first) == (2, [1, 0, 0])


def test_nan_count_scans_in_chunks(monkeypatch):
    """The benchmark's NaN scan of every output (harness.benchmarks.bench_forward.verify, bench_backward.screen) goes
    CHUNK_ELEMENTS at a time: one isnan(t).sum() over a 16384 x 262144 output widened its mask to
    32 GiB of int64 and ran an 80 GB card out of memory."""
    monkeypatch.setattr(guards, "CHUNK_ELEMENTS", 8)
    seen, real = [], torch.isnan
    monkeypatch.setattr(torch, "isnan", lambda t: (seen.append(t.numel()), real(t))[1])
    t = torch.zeros(10, 4)
    t[0, 0] = t[5, 1] = t[9, 3] = float("nan")
    assert guards.nan_count(t) == 3
    assert seen and max(seen) <= 8 and sum(seen) == t.numel()
    assert guards.nan_count(torch.zeros(3)) == 0


# The quiet bit of each format's NaNs: arithmetic and casts make quiet NaNs only.
QUIET_BIT = {torch.float32: 1 << 22, torch.float16: 1 << 9, torch.bfloat16: 1 << 6, torch.float8_e5m2: 1 << 1}


@pytest.mark.parametrize("dtype", list(guards.POISON_BITS), ids=str)
def test_each_poison_is_a_signalling_nan_or_has_a_second_poison(dtype):
    """A poison a kernel could write makes "unwritten" unsound: it is a signalling NaN, or (float8_e4m3fn,
    whose only NaNs are 0x7F and 0xFF) unwritten is told from written by a second call's poison."""
    def value(bits):
        return torch.tensor([bits], dtype=guards._INT_VIEW[dtype.itemsize]).view(dtype).float()

    poison = guards.POISON_BITS[dtype]
    assert torch.isnan(value(poison)).all()
    if dtype in guards.SECOND_POISON_BITS:
        second = guards.SECOND_POISON_BITS[dtype]
        assert second != poison & 0xFF and torch.isnan(value(second)).all()
    else:
        assert not poison & QUIET_BIT[dtype]


def test_a_call_that_reshapes_or_flags_an_input_is_found_and_the_input_put_back():
    storage = torch.randn(3, 6)
    x, w = storage[:, :4], torch.randn(4)
    passed = {"x": x, "weight": w, "bias": None}
    state = guards.input_state(passed)
    assert guards.inputs_altered(state, passed) == []
    x.as_strided_((4, 3), (3, 1))
    w.requires_grad_()
    found = {f.output: f for f in guards.inputs_altered(state, passed)}
    assert found["x"].kind == "input altered" and found["x"].detail == "shape (3, 4) -> (4, 3); strides (6, 1) -> (3, 1)"
    assert found["weight"].summary() == "weight: input altered: requires_grad False -> True"
    assert (x.shape, x.stride(), w.requires_grad) == ((3, 4), (6, 1), False)
    assert torch.equal(x, storage[:, :4])
