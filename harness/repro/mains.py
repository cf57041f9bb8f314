'''The rest of a repro, as source text: the write guard (harness/judging/guards.py and the fused
buffer check of fused_runner.py, inline), the call wrapper, and one ``main`` per check: the plain
forward, the plain backward, the fused forward and the fused backward, each doing what its check
in harness/judging/runner.py or fused_runner.py does.'''

GUARDS = '''
def guard(name, shape, dtype, gap):
    """A poisoned output inside a buffer: HEAD canaries before, TAIL after, ``gap`` after each row."""
    n = shape[-1] if shape else 1
    rows = math.prod(shape[:-1])
    buffer = torch.empty(HEAD + rows * (n + gap) + TAIL, dtype=dtype, device=DEVICE)
    bits_of(buffer).fill_(POISON[dtype])
    strides, acc = [], 1
    for i, s in enumerate(reversed(shape)):
        strides.append(acc)
        acc *= (n + gap) if i == 0 else s
    return Namespace(name=name, buffer=buffer, view=buffer.as_strided(shape, tuple(reversed(strides)), HEAD),
                     rows=rows, n=n, gap=gap)


def inspect(guards):
    """Unwritten elements (still the poison) and writes out of bounds (a canary changed)."""
    found = []
    for g in guards:
        poison = POISON[g.buffer.dtype]
        bits = bits_of(g.buffer)
        rows = bits.as_strided((g.rows, g.n), (g.n + g.gap, 1), HEAD)
        unwritten = torch.nonzero(rows == poison)
        if unwritten.shape[0]:
            offset, index = int(unwritten[0][0]) * (g.n + g.gap) + int(unwritten[0][1]), []
            for stride in g.view.stride():
                index.append(offset // stride)
                offset %= stride
            found.append(f"{g.name}: {unwritten.shape[0]} unwritten element(s), first at element {index}")
        canary = torch.ones_like(bits, dtype=torch.bool)
        canary.as_strided((g.rows, g.n), (g.n + g.gap, 1), HEAD).fill_(False)
        clobbered = torch.nonzero(canary & (bits != poison))
        if clobbered.shape[0]:
            found.append(f"{g.name}: {clobbered.shape[0]} out-of-bounds write element(s), first at buffer offset "
                         f"[{int(clobbered[0][0]) - HEAD}]")
    return found


def inputs_modified(before, given):
    """Inputs the call may not write that changed, bit for bit."""
    found = []
    for name, old in before.items():
        changed = torch.nonzero(bits_of(given[name]) != bits_of(old))
        if changed.shape[0]:
            found.append(f"{name}: {changed.shape[0]} input modified element(s), first at element "
                         f"{[int(i) for i in changed[0]]}")
    return found


def called(fn):
    """Run the call; an exception (a refused compile included) is the finding."""
    try:
        fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return True
    except Exception as exc:  # noqa: BLE001 (what the library raises is what this file shows)
        print(f"the call raised {type(exc).__name__}: {str(exc).strip()}")
        return False


def verdict(findings, found):
    for line in findings:
        print(f"guard: {line}")
    for line, _ in found:
        print(line)
    bad = bool(findings) or any(failed for _, failed in found)
    print("DEFECT PRESENT: outside the allowance or the write guard (exit 1)" if bad else
          "within the allowance and the write guard (exit 0)")
    return 1 if bad else 0


def flat(t):
    return None if t is None else t.view(-1)
'''

BUFFERS = '''
def buffer_findings(buffers, before, views, allowed):
    """Writes to x's and residual's buffers the write convention does not name: a view it does
    not write ("input modified"), or the canaries and padding around them ("out-of-bounds write")."""
    found = []
    for name, buffer in buffers.items():
        changed = bits_of(buffer) != bits_of(before[name])
        if not bool(changed.any()):
            continue
        outside = changed.clone()
        for view_name, (owner, view) in views.items():
            if owner != name:
                continue
            inside = torch.zeros_like(changed)
            inside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
            hit = changed & inside
            outside &= ~inside
            if view_name not in allowed and bool(hit.any()):
                first = int(torch.nonzero(hit.as_strided(view.shape, view.stride(), view.storage_offset()))[0][0])
                found.append(f"{view_name}: {int(hit.sum())} input modified element(s), first at element [{first}]")
        if bool(outside.any()):
            found.append(f"{name}: {int(outside.sum())} out-of-bounds write element(s), first at buffer offset "
                         f"[{int(torch.nonzero(outside)[0][0]) - HEAD}]")
    return found


def reference_fused(x, residual, weight, bias, eps):
    """residual_out = x + residual exactly; the row normalised is that sum rounded as the kernel
    declares (KEEP_DTYPE); the weight is WEIGHT_OFFSET + w in float64."""
    s = x.double()
    src = s
    if residual is not None:
        s = s + residual.double()
        src = s.to(KEEP_DTYPE).double()
    w = None if weight is None else weight.double() + WEIGHT_OFFSET
    return reference(BASE_OP, src, w, bias, eps), s, w
'''

PLAIN_FORWARD = '''
def main():
    x, storage, weight, bias = draw_inputs()
    guards = [guard("y", SHAPE, DTYPE, GAP)] + [guard(s, LEAD, torch.float32, 0) for s in STATS]
    g = {k.name: k.view for k in guards}
    out = Namespace(y=rows_of(g["y"]), mean=flat(g.get("mean")), rstd=flat(g.get("rstd")))
    given = {"x": storage, "weight": weight, "bias": bias}
    before = {k: v.clone() for k, v in given.items() if v is not None}
    if not called(lambda: call_forward(rows_of(x), weight, bias, EPS, out)):
        return 1
    findings = inspect(guards) + inputs_modified(before, given)
    ref = reference(OP, x, weight, bias, EPS)
    extra = None
    if ROUNDING == "before_affine" and weight is not None and DTYPE != torch.float32:
        extra = rounding_extra(OP, x, ref, weight, bias, DTYPE)
    return verdict(findings, compare_outputs(OP, g["y"], g.get("mean"), g.get("rstd"), ref, DTYPE, STAT_DTYPE,
                                             weight, extra))
'''

PLAIN_BACKWARD = '''
def main():
    x, storage, weight, bias = draw_inputs()
    dy, dy_storage = draw_dy()
    stat = lambda: torch.empty(LEAD, dtype=torch.float32, device=DEVICE)  # noqa: E731
    fwd = Namespace(y=torch.empty(SHAPE, dtype=DTYPE, device=DEVICE), mean=stat() if "mean" in STATS else None,
                    rstd=stat() if "rstd" in STATS else None)
    fwd_out = Namespace(y=rows_of(fwd.y), mean=flat(fwd.mean), rstd=flat(fwd.rstd))
    if not called(lambda: call_forward(rows_of(x), weight, bias, EPS, fwd_out)):  # its own mean and rstd
        return 1
    guards = [guard("dx", SHAPE, DTYPE, GAP)] + [guard(k, (N,), t.dtype, 0) for k, t in (("dw", weight), ("db", bias))
                                                if t is not None]
    g = {k.name: k.view for k in guards}
    grads = Namespace(dx=rows_of(g["dx"]), dw=g.get("dw"), db=g.get("db"))
    saved = Namespace(y=rows_of(x), mean=flat(fwd.mean), rstd=flat(fwd.rstd))
    given = {"x": storage, "weight": weight, "bias": bias, "dy": dy_storage, "mean": fwd.mean, "rstd": fwd.rstd}
    before = {k: v.clone() for k, v in given.items() if v is not None}
    if not called(lambda: call_backward(rows_of(x), weight, bias, rows_of(dy), saved, EPS, grads)):
        return 1
    findings = inspect(guards) + inputs_modified(before, given)
    ref = reference_backward(OP, x, dy, weight, bias, EPS)
    floors = backward_floors(OP, x, dy, weight, EPS, STAT_DTYPE)
    return verdict(findings, compare_grads(g, ref, floors, DTYPE))
'''

FUSED_FORWARD = '''
def main():
    buffers, views, weight, bias = draw_inputs()
    x, residual = views["x"][1], views["residual"][1] if "residual" in views else None
    guards = [guard("y", SHAPE, OUT_DTYPE or DTYPE, GAP)] if WRITE != "in_place" else []
    if residual is not None and WRITE == "new":
        guards.append(guard("residual_out", SHAPE, RESIDUAL_OUT_DTYPE, GAP))
    guards += [guard(s, LEAD, torch.float32, 0) for s in STATS]
    g = {k.name: k.view for k in guards}
    y = x if WRITE == "in_place" else g["y"]
    residual_out = residual if WRITE != "new" else g.get("residual_out")
    out = Namespace(y=rows_of(y), residual_out=None if residual_out is None else rows_of(residual_out),
                    mean=flat(g.get("mean")), rstd=flat(g.get("rstd")))
    params = Namespace(weight_offset=WEIGHT_OFFSET, out_dtype=OUT_DTYPE, scale=KERNEL_SCALE, write=WRITE)
    before = {k: b.clone() for k, b in buffers.items()}
    given = {"weight": weight, "bias": bias}
    params_before = {k: v.clone() for k, v in given.items() if v is not None}
    r_rows = None if residual is None else rows_of(residual)
    (ref_y, mean, rstd), exact_sum, w_eff = reference_fused(x, residual, weight, bias, EPS)  # before x is written
    if not called(lambda: call_forward(rows_of(x), r_rows, weight, bias, EPS, params, out)):
        return 1
    if OUT_DTYPE is not None and WRITE != "in_place":  # an fp8 NaN may come out as the poison's bits
        bits = bits_of(g["y"])
        bits[(bits == POISON[OUT_DTYPE]) & torch.isnan(ref_y)] = 0x7F
    allowed = {"new": (), "in_place": ("x", "residual"), "out_y": ("residual",)}[WRITE]
    findings = inspect(guards) + buffer_findings(buffers, before, views, allowed) + inputs_modified(params_before, given)
    found = compare_outputs(BASE_OP, ref_y if OUT_DTYPE is not None else y, g.get("mean"), g.get("rstd"),
                            (ref_y, mean, rstd), DTYPE, STAT_DTYPE, w_eff)
    if OUT_DTYPE is not None:
        floor = Y_FLOOR[torch.float32] * row_scale(BASE_OP, mean, rstd, w_eff)
        found[0] = fp8_compare(y, ref_y, SCALE, OUT_DTYPE, FP8_NAN, floor)
    if residual is not None:
        found.append(compare("residual_out", residual_out, exact_sum, residual_out.dtype, 0.0, RESIDUAL_ULPS))
    return verdict(findings, found)
'''

FUSED_BACKWARD = '''
def main():
    buffers, views, weight, bias = draw_inputs()
    x, residual = views["x"][1], views["residual"][1] if "residual" in views else None
    dy, d_res = draw_fused_dy()
    stat = lambda: torch.empty(LEAD, dtype=torch.float32, device=DEVICE)  # noqa: E731
    fwd = Namespace(y=torch.empty(SHAPE, dtype=DTYPE, device=DEVICE),
                    residual_out=None if residual is None else torch.empty(SHAPE, dtype=RESIDUAL_OUT_DTYPE, device=DEVICE),
                    mean=stat() if "mean" in STATS else None, rstd=stat() if "rstd" in STATS else None)
    fwd_out = Namespace(y=rows_of(fwd.y), residual_out=None if residual is None else rows_of(fwd.residual_out),
                        mean=flat(fwd.mean), rstd=flat(fwd.rstd))
    params = Namespace(weight_offset=WEIGHT_OFFSET, out_dtype=None, scale=None, write="new")
    r_rows = None if residual is None else rows_of(residual)
    if not called(lambda: call_forward(rows_of(x), r_rows, weight, bias, EPS, params, fwd_out)):
        return 1
    named = [("dx", x.dtype)] + ([("dresidual", residual.dtype)] if residual is not None else [])
    guards = [guard(k, SHAPE, dt, GAP) for k, dt in named]
    guards += [guard(k, (N,), t.dtype, 0) for k, t in (("dw", weight), ("db", bias)) if t is not None]
    g = {k.name: k.view for k in guards}
    grads = Namespace(dx=rows_of(g["dx"]), dresidual=rows_of(g["dresidual"]) if "dresidual" in g else None,
                      dw=g.get("dw"), db=g.get("db"))
    given = {**{f"buffer {k}": b for k, b in buffers.items()}, "weight": weight, "bias": bias, "dy": dy,
             "d_residual_out": d_res, **{k: v for k, v in vars(fwd).items()}}
    before = {k: v.clone() for k, v in given.items() if v is not None}
    src_t = fwd.residual_out if residual is not None else x
    saved = Namespace(y=rows_of(src_t), mean=flat(fwd.mean), rstd=flat(fwd.rstd))
    d_rows = None if d_res is None else rows_of(d_res)
    if not called(lambda: call_backward(rows_of(src_t), weight, bias, rows_of(dy), d_rows, saved, EPS, WEIGHT_OFFSET,
                                        grads)):
        return 1
    findings = inspect(guards) + inputs_modified(before, given)
    # The reference normalises what a correct kernel saved: the sum rounded to residual_out's dtype.
    src = (x.double() + residual.double()).to(fwd.residual_out.dtype) if residual is not None else x
    w_eff = None if weight is None else weight.double() + WEIGHT_OFFSET
    ref = reference_backward(BASE_OP, src, dy, w_eff, bias, EPS)
    if d_res is not None:
        ref["dx"] = ref["dx"] + d_res.double()
    floors = backward_floors(BASE_OP, src, dy, w_eff, EPS, STAT_DTYPE)
    found = compare_grads(g, ref, floors, DTYPE)
    if residual is not None:
        ulps, floor = floors["dx"]
        found.append(compare("dresidual", g["dresidual"], in_range(ref["dx"], residual.dtype), residual.dtype, floor,
                             ulps))
    return verdict(findings, found)
'''
