"""What a rank's program is handed: its rank, the collective interface, the array namespace, seeded
random draws, and the marks that turn a run into a lesson. Passed explicitly; there is no global state."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol, Sequence

import numpy as np

from ..comm.interface import Comm, Group, call_site, dtype_name, numpy_dtype, site_name
from ..errors import UsageError
from ..layout.precision import Precision, precision as precision_of
from ..comm.trace import HELD_KINDS


class Recorder(Protocol):
    """What a backend offers a context for marking its trace."""

    def mark(self, rank: int, kind: str, text: str, data: dict | None = None) -> None: ...
    def compute(self, rank: int, name: str, flops: float, site: str) -> None: ...


class Rng:
    """Seeded draws that are identical on every backend: numpy's PCG64 draws (float64), then rounded to
    `dtype` (bfloat16 and float16 round to nearest, ties to even) and moved to `xp`, bit for bit."""

    def __init__(self, seed: int, key: tuple[int, ...], to_xp: Callable[[np.ndarray], Any], floats: str = "float64"):
        self._seed, self._key = seed, key
        self._made: np.random.Generator | None = None
        self._to_xp = to_xp
        self._floats = floats  # the dtype of a draw that names none: the run's float

    @property
    def _gen(self) -> np.random.Generator:
        # made at the first draw: a rank that draws nothing (a run of collectives alone) pays nothing for it
        if self._made is None:
            self._made = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self._seed, spawn_key=self._key)))
        return self._made

    def _out(self, a: np.ndarray, dtype: Any) -> Any:
        return self._to_xp(a.astype(numpy_dtype(self._floats if dtype is None else dtype), copy=False))

    def normal(self, shape: Sequence[int], dtype: Any = None, mean: float = 0.0, std: float = 1.0):
        return self._out(self._gen.normal(mean, std, size=tuple(shape)), dtype)

    def uniform(self, shape: Sequence[int], low: float = 0.0, high: float = 1.0, dtype: Any = None):
        return self._out(self._gen.uniform(low, high, size=tuple(shape)), dtype)

    def integers(self, low: int, high: int, shape: Sequence[int], dtype: Any = "int64"):
        """Integers in [low, high): exact in float32 and float64 (and up to 256 in bfloat16, 2048 in float16),
        so sums that stay exact compare bit for bit."""
        return self._out(self._gen.integers(low, high, size=tuple(shape)), dtype)

    def permutation(self, n: int):
        return self._out(self._gen.permutation(n), "int64")


class Context:
    """One rank's view of the run. `comm` is the collective interface, `xp` the array namespace.

    `precision` (layout/precision.py) is the training precision the run stands for: the dtype of each kind
    of tensor. An `exact` run (virtual and real ranks) computes every kind in float64, so that every layout
    matches the unsplit model; a run at real size (symbolic ranks) computes each kind in the precision's
    dtype, so its trace's bytes are the job's. Layers ask `dtype_for(kind)` and `cast(x, kind)`, never which."""

    symbolic = False  # True on symbolic ranks: arrays have shapes and dtypes, no values (parasim/symbolic)

    def __init__(
        self,
        rank: int,
        world: int,
        comm: Comm,
        xp: Any,
        seed: int,
        recorder: Recorder,
        to_xp: Callable[[np.ndarray], Any],
        precision: Precision | str | None = None,
        exact: bool = True,
    ):
        self.rank = rank
        self.world = world
        self.comm = comm
        self.xp = xp
        self.seed = seed
        self._recorder = recorder
        self._to_xp = to_xp
        self.precision = precision_of(precision)
        self.exact = exact
        self.rng = Rng(seed, (0, rank), to_xp, self.float_name)  # this rank's own stream
        self.marked: list[tuple[str, Any]] = []  # (name, tensor) of each `mark`, in order: `parasim check` reads them
        self.layout: Any = None  # set by use_layout (run(..., layout=...))
        self.groups: dict[str, Group] = {}
        self.coords: Coords | None = None
        self.knobs: dict[str, Any] = {}  # a lesson's settings for this run (--tp 4, -m 16): set by WithKnobs

    def repeat(self, memo: dict, key: Hashable, fn: Callable[[], Any]) -> tuple[Any, bool]:
        """fn()'s result, and whether it is a repeat: where a rank's call does the same work whenever its `key`
        (the shapes it runs on) is the same, a backend may run it once and tell the trace the same events again
        (symbolic ranks, engine/symbolic/repeat.py), handing back the first call's result. `memo`: the caller's
        own, one per thing whose calls repeat (a layer on this rank). Here: fn() every time."""
        return fn(), False

    def shared_rng(self, name: str) -> Rng:
        """A stream that draws the same numbers on every rank (e.g. a full weight before sharding)."""
        return Rng(self.seed, (1, *name.encode()), self._to_xp, self.float_name)

    def asarray(self, values: Any, dtype: Any = None):
        """Literal data (a lesson's worked numbers) as an array of this backend (in the run's float unless
        `dtype` says)."""
        return self._to_xp(np.asarray(values, dtype=numpy_dtype(self.float_name if dtype is None else dtype)))

    @property
    def float_name(self) -> str:
        """The dtype draws and literals are made in: float64 on an exact run, the precision's compute dtype
        (the weights' and inputs') at real size."""
        return "float64" if self.exact else self.precision.compute

    def dtype_for(self, kind: str) -> Any:
        """This backend's dtype for values of `kind` (a field of layout/precision.Precision: compute,
        activations, grad_reduce, dispatch, combine, logits, master, adam, grads): float64 on an exact run, the
        precision's at real size (a master copy the precision does not keep is the parameters' dtype)."""
        if self.exact:
            return self.dtype("float64")
        name = getattr(self.precision, kind)
        return self.dtype(self.precision.params if name is None else name)

    def cast(self, x: Any, kind: str) -> Any:
        """`x` in the dtype of `kind` at real size (itself when it already is: no copy, nothing recorded); on an
        exact run `x` itself, in whatever dtype the program made it."""
        if self.exact:
            return x
        dtype = self.dtype_for(kind)
        return x if x.dtype == dtype else self.xp.astype(x, dtype)

    def dtype(self, name: Any) -> Any:
        """This backend's dtype for `name` ("bfloat16", "float32", ...), for the array namespace's own calls:
        `ctx.xp.astype(x, ctx.dtype("bfloat16"))` runs on every backend, where numpy's namespace has no
        bfloat16 of its own and torch's functions take no dtype names."""
        return self._to_xp(np.empty(0, dtype=numpy_dtype(name))).dtype

    def phase(self, name: str, **data: Any) -> None:
        """Start a lesson step: the events that follow on this rank belong to `name`. `data`: fields that
        screens and checks read (they never parse the name)."""
        self._recorder.mark(self.rank, "phase", name, data or None)

    def note(self, text: str, **data: Any) -> None:
        """Leave a remark in the trace at this rank's current step: `text` for people, `data` (JSON values:
        token, slot, stage, ...) for screens and checks."""
        self._recorder.mark(self.rank, "note", text, data or None)

    def hold(self, name: str, nbytes: int, kind: str) -> None:
        """Say that this rank now keeps `nbytes` under `name` (kind: weights, gradients, optimizer,
        activations or gathered), counted in the training dtypes whatever dtype computes here; holding a name
        again replaces its size. The trace adds them up at every event (`Trace.held`, `Trace.peak`)."""
        if kind not in HELD_KINDS:
            raise UsageError(f"held bytes must be one of {', '.join(HELD_KINDS)}, not {kind!r}")
        if int(nbytes) < 0:
            raise UsageError(f"held bytes cannot be negative: {name!r} {nbytes}")
        self._recorder.mark(self.rank, "held", name, {"kind": kind, "bytes": int(nbytes)})

    def free(self, name: str) -> None:
        """This rank no longer keeps `name`."""
        self._recorder.mark(self.rank, "held", name, {"bytes": 0})

    def mark(
        self,
        name: str,
        x: Any,
        placement: Any = None,
        group: Group | None = None,
        rows: Sequence[int] | None = None,
        size: int | None = None,
    ) -> Any:
        """Name a tensor for `parasim check`: `placement` (a Placement, or "Shard(d)", "Replicate()",
        "Partial()") says how the members of `group` (default: the world) hold the whole tensor, so it can be
        put back together and compared with the reference's tensor of the same name (which marks it whole).
        `rows` (with `size`, the whole's length along dim 0): this piece holds those rows of the whole, e.g.
        the sequence positions of a rank's CP slice or SP share; members with the same rows are put together
        by `placement`, then each block goes to its rows. Returns `x`."""
        from ..layout.placement import Replicate, Shard, parse, spec

        where = group if group is not None else Group(tuple(range(self.world)), "world", 0)
        parsed = parse(placement if placement is not None else Replicate())  # a bad one fails here
        shape = [int(d) for d in x.shape]
        if isinstance(parsed, Shard) and not 0 <= parsed.dim < len(shape):
            # caught here, where the program's line is known, not when `parasim check` puts the pieces together
            raise UsageError(
                f"mark {name!r} at {site_name(call_site(2))}: {spec(parsed)} shards dim {parsed.dim}, "
                f"but the tensor has {len(shape)} dim{'s' if len(shape) != 1 else ''} (shape "
                f"{tuple(shape)}): a Shard's dim is one of 0 to {len(shape) - 1}"
                if shape
                else f"mark {name!r} at {site_name(call_site(2))}: {spec(parsed)} shards a tensor with no "
                "dims (a scalar): mark it Replicate() or Partial()"
            )
        data: dict[str, Any] = {
            "placement": spec(parsed),
            "group": list(where.ranks),
            "group_name": where.name,
            "shape": shape,
            "dtype": dtype_name(x.dtype),
        }
        if rows is not None:
            row_list = [int(r) for r in rows]
            data["rows"], data["size"] = row_list, int(size if size is not None else len(row_list))
            if len(data["rows"]) != data["shape"][0] or any(not 0 <= r < data["size"] for r in data["rows"]):
                raise UsageError(
                    f"mark {name!r} at {site_name(call_site(2))}: rows must give one position in [0, {data['size']}) per row of "
                    f"the tensor ({data['shape'][0]} rows), got {len(data['rows'])}"
                )
        self._recorder.mark(self.rank, "tensor", name, data)
        self.marked.append((name, x))
        return x

    def compute(self, name: str, flops: float = 0) -> None:
        """Record a compute step on this rank (one logical step on the timeline)."""
        self._recorder.compute(self.rank, name, flops, site_name(call_site(2)))

    def new_group(self, ranks: Sequence[int], name: str) -> Group:
        """Same as comm.new_group: every rank calls it for every group, in the same order."""
        return self.comm.new_group(ranks, name)

    def use_layout(self, layout: Any) -> None:
        """Create every group of `layout` in Megatron-Core's order (every rank, every group) and keep this
        rank's: `ctx.groups["tp"]`, `ctx.groups["expert-dp"]`, ...; `ctx.coords.tp` is its index in its tp group."""
        self.layout = layout
        self.groups = {}
        wanted = [(ranks, name) for name, lists in layout.groups().items() for ranks in lists]
        for g in self.comm.new_groups(wanted):  # in one go: 157,728 groups a rank on DeepSeek-V3's 2,048 GPUs
            if self.rank in g.ranks:
                self.groups[g.name] = g
        self.coords = Coords(**{k: v for k, v in layout.coords()[self.rank].items() if k != "rank"})


class Coords:
    """A rank's place in its layout: tp, cp, dp, pp (attention view) and ep, etp, edp (MoE view)."""

    def __init__(self, **coords: int):
        self.__dict__.update(coords)

    def __repr__(self) -> str:
        return "Coords(" + ", ".join(f"{k}={v}" for k, v in self.__dict__.items()) + ")"


class WithLayout:
    """A program that first sets up a layout's groups (picklable, so real ranks can run it too)."""

    def __init__(self, program: Callable[[Any], Any], layout: Any):
        self.program, self.layout = program, layout
        self.__name__ = getattr(program, "__name__", "program")

    def __call__(self, ctx: "Context") -> Any:
        ctx.use_layout(self.layout)
        return self.program(ctx)


class WithKnobs:
    """A program that first reads a lesson's settings into `ctx.knobs` (picklable, as WithLayout is)."""

    def __init__(self, program: Callable[[Any], Any], knobs: dict[str, Any]):
        self.program, self.knobs = program, dict(knobs)
        self.__name__ = getattr(program, "__name__", "program")

    def __call__(self, ctx: "Context") -> Any:
        ctx.knobs = dict(self.knobs)
        return self.program(ctx)
