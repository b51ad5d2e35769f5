"""float16 and bfloat16 on every backend, and NaN in max and min with torch's rule.

Sums of 16-bit floats round after every addition, so the virtual kernel adds them in gloo's order (a ring per
chunk of the flat buffer, torch's member order); the expected bits here are worked out by hand or by a
reference written in this file, and the gloo test at the end holds the two backends equal bit for bit."""
import warnings

import ml_dtypes
import numpy as np
import pytest
from half_ref import ring_reference
from hypothesis import given, settings
from hypothesis import strategies as st

import parasim
from parasim.comm.interface import Recv, Send, dtype_name
from parasim.comm.kernels import ring_chunk
from parasim.engine.compare import Allowance, first_diff, values_close
from parasim.errors import CollectiveError, UsageError
from parasim.comm.trace import Trace

BF16 = np.dtype(ml_dtypes.bfloat16)
NAN, INF = float("nan"), float("inf")
SMALL = 2.0 ** -8  # half a bfloat16 unit at 1.0: 1 + SMALL ties and rounds to the even 1.0
ONE, ONE_UP = 0x3F80, 0x3F81  # bfloat16 bits of 1.0 and of 1 + 2^-7 (= 1 + SMALL + SMALL, added first)


def bits(x) -> list[int]:
    return np.ascontiguousarray(x).view(np.uint16).reshape(-1).tolist()


def bigs(ctx, big: list[int]):
    """Element e is 1.0 on rank big[e] and 2^-8 on every other rank: the sum is 1 + 2^-7 (bits ONE_UP) when
    the two small values meet first, 1.0 (ONE) when the 1.0 comes before either of them."""
    return ctx.asarray([1.0 if b == ctx.rank else SMALL for b in big], "bfloat16")


# -- by hand: the order of gloo's ring ---------------------------------------------------------------
# Three ranks, six elements: gloo cuts the buffer into chunks of 2 * ceil(6 / 6) = 2 elements, chunk c owned
# by member c, and sums chunk c as x[c] + (x[c+1] + x[c+2]). So an element comes out 1 + 2^-7 exactly when its
# 1.0 sits on the chunk's owner (the last to add), and 1.0 otherwise. Group order, ((x0 + x1) + x2), would give
# 1.0 in element 0 and 1 + 2^-7 in element 4.
BIG = [0, 1, 1, 2, 0, 2]
RING = [ONE_UP, ONE, ONE_UP, ONE, ONE, ONE_UP]


def ring_order(ctx):
    x = bigs(ctx, BIG)
    shuffled = ctx.new_group([2, 0, 1], "shuffled")  # torch orders members by global rank: the same ring
    return {"world": ctx.comm.all_reduce(x), "shuffled": ctx.comm.all_reduce(x, group=shuffled),
            "reduce": ctx.comm.reduce(x, 2), "avg": ctx.comm.all_reduce(x, op="avg"),
            "half": ctx.comm.all_reduce(ctx.xp.astype(x, ctx.dtype("float16")))}


def test_three_ranks_add_in_gloos_ring_order():
    v = parasim.run(ring_order, 3).values
    assert [bits(v[r]["world"]) for r in range(3)] == [RING] * 3
    assert [bits(v[r]["shuffled"]) for r in range(3)] == [RING] * 3
    assert [v[r]["reduce"] is None for r in range(3)] == [True, True, False] and bits(v[2]["reduce"]) == RING
    # the average divides the sum by 3 in bfloat16: (1 + 2^-7) / 3 = 43/128 exactly, 1/3 rounds to 0x3EAB
    assert bits(v[0]["avg"]) == [0x3EAC if b == ONE_UP else 0x3EAB for b in RING]
    # float16 keeps 11 bits: 1 + 2^-8 + 2^-8 is exact in any order
    assert v[0]["half"].dtype == np.float16 and v[0]["half"].tolist() == [1 + 2 * SMALL] * 6


def shuffled_reduce_scatter(ctx):
    """Each rank holds one element per member; the group's order is not torch's."""
    g = ctx.new_group([2, 0, 1], "shuffled")
    world = ctx.comm.reduce_scatter(bigs(ctx, [2, 0, 1]))
    return {"world": world, "shuffled": ctx.comm.reduce_scatter(bigs(ctx, [1, 0, 2]), group=g)}


def test_reduce_scatter_sums_the_flat_buffer_torch_sends():
    """torch runs gloo's reduce-scatter as an all-reduce of the whole 3-element buffer: chunks of 2 elements,
    so member 0 owns elements 0 and 1 and member 1 owns element 2 (member 2 owns none). On the world, rank 1's
    element (its 1.0 on rank 0, the owner) and rank 2's (on rank 1, its owner) come out 1 + 2^-7.
    On the group [2, 0, 1], torch lays member i's chunk at the place of rank [2, 0, 1][i]: rank R gets the sum
    at buffer place R, made of each rank's chunk [2, 0, 1].index(R) (bigs on ranks 0, 2, 1 for R = 0, 1, 2)."""
    v = parasim.run(shuffled_reduce_scatter, 3).values
    assert [bits(v[r]["world"]) for r in range(3)] == [[ONE], [ONE_UP], [ONE_UP]]
    assert [bits(v[r]["shuffled"]) for r in range(3)] == [[ONE_UP], [ONE], [ONE_UP]]


# gloo's segment rules (gloo/allreduce.cc and gloo/reduce.cc) by hand: S segments, a multiple of t and at least
# 2t, of at most 1 MiB; each member's chunk is S/t segments. The 3.5 M cases were confirmed on gloo.
@pytest.mark.parametrize("n, itemsize, t, reduce_only, chunk", [
    (1, 2, 4, False, 2),  # 8 segments of 1 element
    (13, 2, 3, False, 6),  # 6 segments of ceil(13/6) = 3
    (1000, 2, 3, False, 334),
    (1000, 4, 8, False, 126),  # 16 segments of ceil(1000/16) = 63
    (3_500_003, 2, 3, False, 1_166_670),  # 7 MB: 9 segments of 777,780 B
    (3_500_003, 2, 3, True, 1_572_864),  # reduce: 1 MiB segments, 9 of them
], ids=["one", "13", "1000", "f32", "big", "big-reduce"])
def test_ring_chunk(n, itemsize, t, reduce_only, chunk):
    assert ring_chunk(n, itemsize, t, reduce_only) == chunk


# -- a property: any values, any group size --------------------------------------------------------------

VALUES = st.builds(lambda k, e: k / 128 * 2.0 ** e, st.integers(-255, 255), st.integers(-8, 8))


def summing(xs: np.ndarray):
    def program(ctx):
        x = ctx.asarray(xs[ctx.rank].tolist(), xs.dtype)
        return {"ar": ctx.comm.all_reduce(x), "rs": ctx.comm.reduce_scatter(x) if x.shape[0] % ctx.world == 0 else None}
    return program


@settings(max_examples=40, deadline=None)
@given(t=st.integers(2, 5), n=st.integers(1, 30), dtype=st.sampled_from(["bfloat16", "float16"]), data=st.data())
def test_any_sums_match_the_ring_reference(t, n, dtype, data):
    xs = np.array([[data.draw(VALUES) for _ in range(n)] for _ in range(t)]).astype(np.dtype(dtype))
    v = parasim.run(summing(xs), t).values
    want = np.asarray(ring_reference(xs), dtype=np.float64).tolist()
    assert all(np.asarray(v[r]["ar"], dtype=np.float64).tolist() == want for r in range(t))
    if n % t == 0:  # the world's reduce-scatter sums the same flat buffer, so it keeps slices of the same sums
        assert [np.asarray(v[r]["rs"], dtype=np.float64).tolist() for r in range(t)] == \
               [want[r * n // t:(r + 1) * n // t] for r in range(t)]


def test_two_dim_averages_sum_the_flat_buffer_torch_sends():
    """A (4, 8) bfloat16 array on 4 ranks: the all-reduce sums the flat buffer in ring order and comes back in
    the array's shape; the reduce-scatter on dim 1 sums the buffer torch lays out (each member's chunk, dim 1
    first, in member order) and member i keeps block i, back in (4, 2). The average divides by 4, which is
    exact in bfloat16, so only the order of the sums is at stake."""
    t, shape = 4, (4, 8)
    rng = np.random.default_rng(7)
    xs = (rng.integers(-255, 256, (t, *shape)) / 128 * 2.0 ** rng.integers(-8, 9, (t, *shape))).astype(BF16)

    def program(ctx):
        x = ctx.asarray(xs[ctx.rank].astype(np.float64).tolist(), "bfloat16")
        return {"ar": ctx.comm.all_reduce(x, op="avg"), "rs": ctx.comm.reduce_scatter(x, op="avg", dim=1)}

    v = parasim.run(program, t).values
    want = (ring_reference(xs.reshape(t, -1)).astype(np.float32) / t).reshape(shape)
    laid = np.stack([np.concatenate([x[:, 2 * j:2 * j + 2].T.reshape(-1) for j in range(t)]) for x in xs])
    blocks = (ring_reference(laid).astype(np.float32) / t).reshape(t, 2, 4)  # block i: chunk i, dim 1 first
    for r in range(t):
        assert v[r]["ar"].shape == shape and v[r]["ar"].astype(np.float32).tolist() == want.tolist()
        assert v[r]["rs"].shape == (4, 2) and v[r]["rs"].astype(np.float32).tolist() == blocks[r].T.tolist()


# -- NaN: torch's rule on every op -----------------------------------------------------------------------
# (op, each rank's values) -> the result: NaN wherever any rank has one, else the max or min.
NAN_CASES = [
    ("max", [[NAN, 1.0], [0.0, 0.0]], [NAN, 1.0]),
    ("max", [[0.0, 0.0], [NAN, 1.0]], [NAN, 1.0]),
    ("min", [[NAN, 1.0], [0.0, 0.0]], [NAN, 0.0]),
    ("min", [[0.0, 2.0], [1.0, NAN]], [0.0, NAN]),
    ("max", [[INF, -INF], [NAN, 0.0]], [NAN, 0.0]),
    ("max", [[1.0, NAN], [NAN, 2.0], [0.0, 3.0]], [NAN, NAN]),
    ("min", [[5.0, 1.0], [4.0, NAN], [NAN, 3.0]], [NAN, NAN]),
    ("max", [[0.0, 1.0], [2.0, 0.0], [1.0, NAN], [3.0, 4.0]], [3.0, NAN]),
    ("min", [[0.0, 1.0], [NAN, 0.0], [1.0, 5.0], [3.0, -1.0]], [NAN, -1.0]),
]


def nans(ctx):
    """Every NAN_CASES case whose ranks fit, through all_reduce, reduce_scatter and reduce, in float32 and
    bfloat16."""
    out = []
    for op, values, _ in NAN_CASES:
        t = len(values)
        g = ctx.new_group(range(t), f"t{t}") if t <= ctx.world else None
        if g is None or ctx.rank not in g.ranks:
            out.append(None)
            continue
        got = {}
        for dtype in ("float32", "bfloat16"):
            x = ctx.asarray(values[ctx.rank], dtype)
            got[dtype] = [ctx.comm.all_reduce(x, op=op, group=g),
                          ctx.comm.reduce_scatter(ctx.xp.concat([x] * t), op=op, group=g),
                          ctx.comm.reduce(x, t - 1, op=op, group=g)]
        out.append(got)
    return out


def _nan_results(values: list, world: int) -> list:
    """Per case and rank: the results that must equal the case's expected vector."""
    found = []
    for (op, ranks, want), per in zip(NAN_CASES, zip(*values)):
        t = len(ranks)
        for r in range(min(t, world)):
            for dtype, (ar, rs, rd) in per[r].items():
                found += [(op, dtype, "all_reduce", ar, want), (op, dtype, "reduce_scatter", rs, want)]
                if r == t - 1:
                    found.append((op, dtype, "reduce", rd, want))
    return found


def _same(got, want) -> bool:
    a = np.asarray(got, dtype=np.float64)
    return a.tolist() == want or (np.array_equal(np.isnan(a), np.isnan(want)) and
                                  np.array_equal(a[~np.isnan(a)], np.asarray(want)[~np.isnan(want)]))


def test_nan_propagates_through_max_and_min_on_virtual_ranks():
    v = parasim.run(nans, 4).values
    results = _nan_results(v, 4)
    assert len(results) == 2 * (2 * (2 + 2 + 2 + 2 + 2 + 3 + 3 + 4 + 4) + 9)
    bad = [(op, dtype, call, np.asarray(got, dtype=np.float64).tolist(), want)
           for op, dtype, call, got, want in results if not _same(got, want)]
    assert not bad


# -- dtypes: names, bytes, every backend's arrays ------------------------------------------------------------

def names(ctx):
    x = ctx.rng.normal((1024,), dtype="bfloat16")
    y = ctx.rng.uniform((4,), dtype=ctx.dtype("float16"))
    nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    got = ctx.comm.exchange([Send(x[:4], nxt), Recv(prv, (4,), "bfloat16")])[0]
    ctx.comm.all_reduce(x, algo="ring")
    return {"x": x, "y": y, "got": got, "ones": ctx.comm.all_reduce(ctx.xp.ones(3, dtype="bfloat16"))}


@pytest.mark.parametrize("backend", ["virtual", "symbolic"])
def test_bfloat16_has_its_name_and_two_bytes_an_element(backend):
    res = parasim.run(names, 4, backend=backend)
    events = res.trace.events
    assert [e.op for e in events] == ["p2p"] * 4 + ["all_reduce", "all_reduce"]
    assert {t.dtype for e in events for m in e.members for t in m.ins + m.outs} == {"bfloat16"}
    assert [m.sent for m in events[0].members] == [8, 0]  # four values of 2 bytes
    assert [m.sent for m in events[4].members] == [3072] * 4  # ring: 2 (t-1)/t of 2,048 bytes
    v = res.values[0]
    assert [dtype_name(v[k].dtype) for k in ("x", "y", "got", "ones")] == ["bfloat16", "float16", "bfloat16",
                                                                          "bfloat16"]
    if backend == "virtual":
        assert np.asarray(v["ones"], dtype=np.float64).tolist() == [4.0] * 3
        assert bits(res.values[1]["got"]) == bits(res.values[0]["x"][:4])


# what symbolic ranks answer for a bfloat16 array's dtype, held against numpy's own answer (virtual ranks)
DTYPE_RULES = [lambda xp, x: xp.mean(x), lambda xp, x: xp.mean(x, axis=0), lambda xp, x: xp.sum(x, axis=1),
               lambda xp, x: xp.matmul(x, xp.permute_dims(x, (1, 0))), lambda xp, x: xp.exp(x),
               lambda xp, x: x * 2.0, lambda xp, x: xp.concat([x, x]), lambda xp, x: xp.astype(x, xp.float32)]


def rules(ctx):
    x = ctx.xp.ones((2, 3), dtype="bfloat16")
    return [dtype_name(rule(ctx.xp, x).dtype) for rule in DTYPE_RULES]


def test_symbolic_bfloat16_dtypes_are_a_training_steps():
    """Virtual ranks compute with numpy's rules (ml_dtypes' bfloat16 matmul, and a product with a Python float,
    give float32); a run at real size keeps BF16 where a GPU's kernels do (a BF16 GEMM gives BF16, scaling by
    2.0 keeps BF16), and otherwise agrees with numpy."""
    want = parasim.run(rules, 1).values[0]
    assert want == ["bfloat16"] * 3 + ["float32", "bfloat16", "float32", "bfloat16", "float32"]
    assert parasim.run(rules, 1, backend="symbolic").values[0] == ["bfloat16"] * 7 + ["float32"]


def test_a_bfloat16_trace_file_reads_back(tmp_path):
    trace = parasim.run(names, 4, keep_values=4).trace
    trace.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert [t.dtype for e in back.events for m in e.members for t in m.ins] == \
           [t.dtype for e in trace.events for m in e.members for t in m.ins]
    assert back.events[-1].members[0].after == trace.events[-1].members[0].after == ([4.0, 4.0, 4.0],)


def _send_recv(dtype):
    def program(ctx):
        if ctx.rank == 0:
            ctx.comm.send(ctx.asarray([1.0]), 1)
        else:
            ctx.comm.recv(0, (1,), dtype)
    return program


# (program, error, words): dtypes that hold no numbers are refused in one line, the others run
DTYPE_CASES = [
    (lambda ctx: ctx.asarray([1.0], "foo"), UsageError, "unknown dtype 'foo'"),
    (lambda ctx: ctx.rng.normal((2,), dtype="U3"), UsageError, "dtype 'U3' holds no numbers"),
    (lambda ctx: ctx.dtype("object"), UsageError, "dtype 'object' holds no numbers"),
    (lambda ctx: ctx.comm.all_reduce(np.zeros(2, dtype="V2")), CollectiveError, "expects numbers, got an array of "
                                                                                  "dtype |V2"),
    (lambda ctx: ctx.comm.all_reduce(ctx.asarray([1], "int64"), op="avg"), CollectiveError,
     "op='avg' needs a floating dtype, got int64"),
    (_send_recv("V8"), CollectiveError, "bad shape (1,) or dtype 'V8'"),
    (lambda ctx: ctx.comm.all_reduce(ctx.asarray([1.5], "bfloat16"), op="avg"), None, None),
    (lambda ctx: ctx.comm.all_reduce(ctx.asarray([1.5], ml_dtypes.bfloat16), op="max"), None, None),
]


@pytest.mark.parametrize("program, error, words", DTYPE_CASES,
                         ids=["unknown", "strings", "objects", "void", "avg-int", "recv-void", "avg-bf16", "max-bf16"])
def test_dtype_cases(program, error, words):
    if error is None:
        (got, _) = parasim.run(program, 2).values
        assert got.dtype == BF16 and float(got[0]) == 1.5
        return
    with pytest.raises(error) as caught:
        parasim.run(program, 2)
    assert words in str(caught.value) and "\n" not in str(caught.value).split(" (called at")[0]


# -- comparing real and virtual values: NaN at the same place is equal, no warnings ----------------------------
# (real, virtual, dtype) -> (equal, tolerance used), allowing one rounding on each side of the array's largest
# value (two for nan-tol: 2e-7 beside 1.0 is 1.7 float32 units of 2^-23)
CLOSE_CASES = [
    ([NAN, 1.0], [NAN, 1.0], "float32", (True, False)),
    ([NAN, 1.0], [0.0, 1.0], "float32", (False, False)),
    ([1.0, 2.0], [1.0, NAN], None, (False, False)),
    ([INF, NAN, -INF], [INF, NAN, -INF], "float64", (True, False)),
    ([INF, 1.0], [-INF, 1.0], "float32", (False, True)),
    ([NAN, 1.0], [NAN, 1.0 + 2e-7], "float32", (True, True)),
    (np.array([1.0, NAN], dtype=BF16), np.array([1.0, NAN], dtype=BF16), "bfloat16", (True, False)),
    (np.array([1.0078125, 3.0], dtype=BF16), np.array([1.0, 3.0], dtype=BF16), "bfloat16", (True, True)),
    (np.array([1.25, 3.0], dtype=BF16), np.array([1.0, 3.0], dtype=BF16), "bfloat16", (False, True)),
    ([[1.0, NAN]], [[1.0, NAN]], "float16", (True, False)),
]


@pytest.mark.parametrize("real, virtual, dtype, want", CLOSE_CASES,
                         ids=["nan", "one-side", "one-side-none", "inf", "inf-sign", "nan-tol", "bf16-nan",
                              "bf16-unit", "bf16-far", "f16-nested"])
def test_compare_values(real, virtual, dtype, want):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        roundings = 2 if isinstance(virtual, list) and virtual[1:] == [1.0 + 2e-7] else 1
        ok, close = values_close(real, virtual, dtype, Allowance(roundings, "their array's largest value"))
        assert (ok, close is not None) == want


def test_the_first_difference_is_the_nan_on_one_side():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = first_diff(np.array([INF, 2.0, NAN, 4.0]), np.array([INF, 2.5, 3.0, 4.0]))
    assert text == " at [2] of 4: real np.float64(nan), virtual np.float64(3.0)"


# -- gloo: the same programs, bit for bit ------------------------------------------------------------------

def every_half_op(ctx):
    """Every call in bfloat16 and float16: sizes that split unevenly, a group out of torch's order (members
    3, 1, 2 on a world of 4), reduce-scatter on dim 0 and 1, the average, the ring, roots, point-to-point."""
    comm, out = ctx.comm, {}
    odd = ctx.new_group([3, 1, 2], "odd")
    for dtype in ("bfloat16", "float16"):
        x = ctx.rng.normal((1037,), dtype=dtype) * 4
        m = ctx.rng.normal((12, 6), dtype=dtype)
        got = {"ar": comm.all_reduce(x), "avg": comm.all_reduce(x, op="avg"), "ring": comm.all_reduce(x, algo="ring"),
               "rs0": comm.reduce_scatter(m, 0), "rd": comm.reduce(x, 1), "ag": comm.all_gather(m, 1),
               "bc": comm.broadcast(x, 2), "a2a": comm.all_to_all([m[:j + 1] for j in range(ctx.world)])}
        if ctx.rank in odd.ranks:
            got.update({"odd": comm.all_reduce(x, group=odd), "odd_rs1": comm.reduce_scatter(m, 1, group=odd),
                        "odd_rd": comm.reduce(x, 2, group=odd), "odd_avg": comm.reduce_scatter(m, 0, group=odd,
                                                                                           op="avg")})
        nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
        got["p2p"] = comm.exchange([Send(x[:5], nxt), Recv(prv, (5,), dtype)])[0]
        out[dtype] = got
    return out


@pytest.mark.slow
def test_gloo_gives_the_same_bits():
    """One launch of 4 gloo ranks runs both programs; each is compared call by call with its virtual run."""
    pytest.importorskip("torch")
    from parasim.engine.launch import RealOptions
    from parasim.engine.real import run_real_many
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # comparing NaNs prints nothing
        reports = run_real_many([(every_half_op, RealOptions("gloo", keep_values=8)), (nans, RealOptions("gloo"))], 4)
    assert [(r.match, r.tolerance_used) for r in reports] == [(True, False)] * 2, [r.differences for r in reports]
    virtual = parasim.run(every_half_op, 4).values
    for r in range(4):
        for dtype, got in virtual[r].items():
            real = reports[0].values[r][dtype]
            assert set(real) == set(got)
            for k, v in got.items():
                vs, rs = (v, real[k]) if isinstance(v, list) else ([v], [real[k]])
                assert all(a is None and b is None or (a.dtype == b.dtype and bits(a) == bits(b))
                           for a, b in zip(vs, rs)), (r, dtype, k)
    bad = [(op, dtype, call, np.asarray(got, dtype=np.float64).tolist(), want)
           for op, dtype, call, got, want in _nan_results(reports[1].values, 4) if not _same(got, want)]
    assert not bad


def test_a_float32_sum_adds_in_the_groups_order_not_gloos_ring():
    """Only 16-bit floats add in gloo's ring order; float32 adds member after member: 1e8 + 1 rounds to 1e8, so
    ((1e8 + 1) - 1e8) + 1 = 1, where the ring's 1e8 + (1 + (-1e8 + 1)) = 0 (float32 scalars worked in the test)."""
    vals = np.array([1e8, 1, -1e8, 1], np.float32)

    def program(ctx):
        return ctx.comm.all_reduce(np.array([vals[ctx.rank]], np.float32))

    want = ((vals[0] + vals[1]) + vals[2]) + vals[3]
    ring = vals[0] + (vals[1] + (vals[2] + vals[3]))
    assert (want, ring) == (1, 0)
    assert [float(v[0]) for v in parasim.run(program, 4).values] == [1.0] * 4
