"""The drawing code of a repro: a case's inputs written out as the harness draws them
(harness.judging.inputs, harness.judging.fused_inputs), specialised to the case, so that the file
draws the same bits on the same kind of device with nothing of normdiff imported.
tests/test_repro_draw.py holds the generated code to the harness's draws bit for bit."""
from __future__ import annotations

import math

from harness.judging.guards import HEAD, POISON_BITS, TAIL
from harness.judging.inputs import DRAW_CHUNK_ELEMENTS
from impls.fused import ADD_OPS, BASE_OP

# One branch of harness.judging.inputs.make_x each: ``normal()`` draws standard normal float64.
DIST_LINES = {
    "normal": ["x = normal()"],
    "offset": ["lead = (*shape[:-1], 1)  # mean and scale vary per row",
               "x = normal() * torch.rand(lead, generator=gen, dtype=torch.float64, device=dev) * 4 + torch.randn(",
               "    lead, generator=gen, dtype=torch.float64, device=dev) * 3"],
    "large_mean": ["x = 1e4 + normal() * max(1.0, 1e4 * torch.finfo(dtype).eps)  # E[x^2] - E[x]^2 cancels"],
    "constant": ["x = torch.randn((*shape[:-1], 1), generator=gen, dtype=torch.float64, device=dev).expand(shape)"
                 ".clone() * 2"],
    "tiny": ["x = normal() * (1e-4 if dtype == torch.float16 else 1e-12)"],
    "huge": ["x = normal() * (1e4 if dtype == torch.float16 else 1e12)"],
    "outlier_first": ["x = normal()", "x[..., 0] = 8 * shape[-1] ** 0.5"],
    "nan_row": ["x = normal()", "flat = x.view(-1, shape[-1])", "flat[flat.shape[0] // 2, shape[-1] // 3] = float('nan')"],
}
CHUNKED = [
    "x = torch.empty(shape, dtype=dtype, device=dev)  # drawn in row chunks, as the harness draws it",
    "flat = x.view(-1, shape[-1])",
    f"step = max(1, {DRAW_CHUNK_ELEMENTS} // shape[-1])",
    "for start in range(0, flat.shape[0], step):",
    "    part = flat[start:start + step]",
    "    part.copy_(torch.randn(part.shape, generator=gen, dtype=torch.float64, device=dev))",
    "return x",
]
DTYPE_SRC = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16",
             "e4m3": "torch.float8_e4m3fn", "e5m2": "torch.float8_e5m2"}


def make_x_source(dists: list[str], chunked: bool) -> list[str]:
    """``make_x(dist, shape, dtype, gen)`` with the branches of ``dists`` only."""
    lines = ["def make_x(dist, shape, dtype, gen):",
             '    """x of one distribution, as harness/judging/inputs.py make_x draws it."""',
             "    dev = gen.device"]
    if chunked:
        lines += ["    if dist == 'normal' and math.prod(shape) > %d:" % DRAW_CHUNK_ELEMENTS]
        lines += ["        " + ln for ln in CHUNKED]
    lines.append("    normal = lambda: torch.randn(shape, generator=gen, dtype=torch.float64, device=dev)  # noqa: E731")
    for i, dist in enumerate(dict.fromkeys(dists)):
        lines.append(f"    {'if' if i == 0 else 'elif'} dist == {dist!r}:")
        lines += ["        " + ln for ln in DIST_LINES[dist]]
    lines += ["    else:", "        raise ValueError(dist)", "    return x.to(dtype)", ""]
    return lines


def _weight_lines(case, dtype: str, fused: bool) -> list[str]:
    lines = []
    if case.has_weight:
        if fused and case.weight_dist == "small":
            lines += ["mag = (0.6 + 0.4 * torch.rand(N, generator=gen, device=gen.device, dtype=torch.float64)) * 2.0**-8",
                      "sign = torch.where(torch.rand(N, generator=gen, device=gen.device) < 0.5, -1.0, 1.0).double()",
                      f"weight = (mag * sign).to({dtype})  # |w| < 2**-8, both signs"]
        elif fused and case.weight_offset:
            lines.append(f"weight = (0.5 * torch.randn(N, generator=gen, device=gen.device)).to({dtype})  # near 0: 1 + w")
        else:
            lines.append(f"weight = (1.0 + 0.5 * torch.randn(N, generator=gen, device=gen.device)).to({dtype})")
    if case.has_bias:
        lines.append(f"bias = (0.5 * torch.randn(N, generator=gen, device=gen.device)).to({dtype})")
    return lines


def plain_inputs(case) -> list[str]:
    """``draw_inputs()`` of a plain case: harness.judging.inputs.make_inputs."""
    lines = make_x_source([case.dist], case.dist == "normal" and _elements(case) > DRAW_CHUNK_ELEMENTS)
    body = ["gen = torch.Generator(device=DEVICE).manual_seed(SEED)",
            "storage = make_x(DIST, (*LEAD, N + PAD), DTYPE, gen)  # x with PAD elements after each row",
            "x = storage[..., :N]", "weight = bias = None"]
    body += _weight_lines(case, "DTYPE", fused=False)
    body.append("return x, storage, weight, bias")
    return lines + ["def draw_inputs():"] + ["    " + ln for ln in body] + [""]


def dy_source(case) -> list[str]:
    """``draw_dy()``: harness.judging.inputs.make_dy (dy with x's shape, dtype and row stride)."""
    body = ["gen = torch.Generator(device=DEVICE).manual_seed(DY_SEED)",
            "dy = torch.randn((*LEAD, N + PAD), generator=gen, dtype=torch.float64, device=DEVICE)",
            "flat = dy.view(-1, N + PAD)"]
    if case.dy_dist == "outliers":
        body += ["flat.view(-1)[::97] *= 10", "flat[flat.shape[0] // 2] *= 100"]
    elif case.dy_dist == "zeros":
        body += ["flat.mul_(torch.rand(flat.shape, generator=gen, dtype=torch.float64, device=DEVICE) < 0.5)",
                 "flat[0] = 0", "flat[:, 0] = 0"]
    body += ["storage = dy.to(DTYPE)", "return storage[..., :N], storage"]
    return ["def draw_dy():"] + ["    " + ln for ln in body] + [""]


def _elements(case) -> int:
    return math.prod(case.shape[:-1]) * (case.n + case.row_pad)


def fused_inputs(case) -> list[str]:
    """``draw_inputs()`` of a fused case: harness.judging.fused_inputs.make_fused_inputs (x and
    residual inside poisoned buffers with HEAD and TAIL canaries)."""
    x_dist = {"fp8_max": "constant", "sum_rounds": "normal"}.get(case.dist, case.dist)
    r_dist = {"nan_row": "normal", "fp8_max": "constant", "sum_rounds": "normal"}.get(case.dist, case.dist)
    add = case.op in ADD_OPS
    lines = make_x_source([x_dist] + ([r_dist] if add else []), False)
    lines += [f"HEAD, TAIL = {HEAD}, {TAIL}  # poisoned canary elements before and after each input buffer", ""]
    body = ["gen = torch.Generator(device=DEVICE).manual_seed(SEED)",
            f"x_vals = make_x({x_dist!r}, (*LEAD, N), DTYPE, gen)", "residual_vals = None"]
    if add:
        body += [f"rgen = torch.Generator(device=DEVICE).manual_seed(SEED ^ 0x5EED)",
                 f"residual_vals = make_x({r_dist!r}, (*LEAD, N), RESIDUAL_DTYPE, rgen)"]
        if case.dist == "sum_rounds":
            body += ["x_vals = (x_vals.double() * 64).to(DTYPE)",
                     "residual_vals = (0.1 * torch.sign(x_vals.double())).to(RESIDUAL_DTYPE)"]
    body += ["rows = math.prod(LEAD)", "buffers, views = {}, {}"]  # views: name -> (buffer, view)
    if case.adjacent:
        body += ["row_stride = 2 * N + PAD  # rows [x | residual | padding] of one buffer",
                 "buffers['x+residual'] = poisoned(HEAD + rows * row_stride + TAIL, DTYPE)",
                 "views['x'] = ('x+residual', place(buffers['x+residual'], 0, row_stride, x_vals))",
                 "views['residual'] = ('x+residual', place(buffers['x+residual'], N, row_stride, residual_vals))"]
    else:
        body += ["buffers['x'] = poisoned(HEAD + rows * (N + PAD) + TAIL, DTYPE)",
                 "views['x'] = ('x', place(buffers['x'], 0, N + PAD, x_vals))"]
        if add:
            body += ["buffers['residual'] = poisoned(HEAD + rows * (N + PAD) + TAIL, RESIDUAL_DTYPE)",
                     "views['residual'] = ('residual', place(buffers['residual'], 0, N + PAD, residual_vals))"]
    body.append("weight = bias = None")
    body += _weight_lines(case, "DTYPE", fused=True)
    if case.dist == "fp8_max" and case.out_dtype:
        target = "bias" if BASE_OP[case.op] == "layer_norm" and case.has_bias else "weight"
        if (target == "bias" and case.has_bias) or (target == "weight" and case.has_weight):
            body += ["# every 7th y lands on the fp8 maximum times the scale",
                     f"top = torch.finfo(OUT_DTYPE).max * {case.scale!r}",
                     "signs = torch.where(torch.arange(N, device=gen.device) % 2 == 0, 1.0, -1.0)[::7]",
                     f"{target}[::7] = (top * signs).to(DTYPE)"]
    body.append("return buffers, views, weight, bias")
    helpers = [
        "def poisoned(size, dtype):",
        "    buffer = torch.empty(size, dtype=dtype, device=DEVICE)",
        "    bits_of(buffer).fill_(POISON[dtype])",
        "    return buffer",
        "",
        "def place(buffer, col0, row_stride, values):",
        '    """A view of SHAPE in ``buffer`` at HEAD + col0 with rows ``row_stride`` apart, holding ``values``."""',
        "    stride, acc = [], 1",
        "    for i, s in enumerate(reversed(SHAPE)):",
        "        stride.append(acc)",
        "        acc *= row_stride if i == 0 else s",
        "    view = buffer.as_strided(SHAPE, tuple(reversed(stride)), HEAD + col0)",
        "    view.copy_(values)",
        "    return view",
        "",
    ]
    return lines + helpers + ["def draw_inputs():"] + ["    " + ln for ln in body] + [""]


def fused_dy_source(case) -> list[str]:
    """``draw_fused_dy()``: harness.judging.fused_inputs.make_fused_dy."""
    lines = dy_source(case)
    body = ["dy, _ = draw_dy()"]
    if case.op not in ADD_OPS:
        body.append("return dy.contiguous(), None")
    else:
        body += ["gen = torch.Generator(device=DEVICE).manual_seed(SEED ^ 0xD1FF)",
                 "dres = 0.5 * torch.randn(SHAPE, generator=gen, dtype=torch.float64, device=gen.device)",
                 "return dy.contiguous(), dres.to(RESIDUAL_DTYPE)"]
    return lines + ["def draw_fused_dy():"] + ["    " + ln for ln in body] + [""]


def poison_source() -> list[str]:
    """The guards' poison bit patterns and the bit view (harness.judging.guards)."""
    items = ", ".join(f"{dtype}: {bits}" for dtype, bits in POISON_BITS.items())
    return ["# Signalling NaNs with a payload no arithmetic produces (fp8: a negative NaN a cast never gives).",
            f"POISON = {{{items}}}",
            "INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32}", "",
            "def bits_of(t):", "    return t.view(INT_VIEW[t.element_size()])", ""]
