"""A CUDA device that is not there: run the engine's CUDA code path on a machine without a GPU.

Why: the GPU path (engine/gpu, the CUDA branches of the model, cache, verifier and drafters) is
only *run* where a GPU is lent, so a device bug in it (a host tensor meeting a device one, a host
``torch.Generator`` used with device tensors, a host sync inside a CUDA-graph capture) would
otherwise first show on a GPU. Under :func:`fake_cuda` tensors *claim* to be on ``cuda:0`` and
the device rules real CUDA enforces are enforced, while every value is computed for real on the
CPU, so the session loop (which needs token ids on the host) runs end to end.

Why not PyTorch's ``FakeTensorMode``: it does make ``device="cuda"`` tensors without a GPU and
raises on a cross-device op or an ``.item()`` (tests/gpu/test_fake_cuda.py checks that), but its
tensors have no values, so nothing data-dependent (an argmax read as a token, the acceptance
walk) can run; and on a CPU-only build it cannot even run advanced indexing on a "cuda" tensor
(``RuntimeError: PyTorch is not linked with support for cuda devices``), which every forward does
(the rotary table lookup, ``index_copy_`` into the cache). It also does not check generators.

The mechanism, three layers:

* :class:`FakeCudaTensor`, a wrapper subclass: it reports ``device == cuda:0`` and holds the real
  data in a CPU tensor (``elem``). Its ``__torch_dispatch__`` sees every aten op and raises what
  CUDA would: a non-scalar CPU tensor in an op with device tensors (``Expected all tensors to be on
  the same device``; copies and the index of ``t[idx]`` excepted, as on CUDA), a CPU generator for
  a device op (``Expected a 'cuda' device type for generator``), and inside a graph capture any
  host sync (``.item()``, ``int(t)``, ``.tolist()``, ``.cpu()``, ``nonzero``, bool masks, copies in
  either direction): :class:`HostSyncError`.
* :class:`FakeCudaMode`, a ``TorchFunctionMode``: factories and copies that name ``cuda``
  (``torch.zeros(..., device="cuda")``, ``t.to("cuda")``, ``torch.tensor(..., device=...)``) would
  fail in C++ before any dispatch on a CPU-only build, so they are rewritten here to make the CPU
  tensor and wrap it. ``pin_memory`` becomes a copy marked as pinned. Python indexing and a few
  hand-written Tensor methods (``copy_``, ``contiguous``, ``nonzero``, ``new_tensor``, ``~``) open
  a CUDA device guard in C++, so on device tensors they are sent to the aten op (same checks);
  ``scaled_dot_product_attention``, whose C++ makes device tensors of its own for a causal or
  boolean mask, runs on the host data (the eager prefill's attention, a catch-up's).
  ``torch.Generator(device="cuda")`` cannot be faked: engine code that makes one (random_init,
  train/data) cannot run here; the session's path makes none.
* Patches of ``torch.cuda`` (``Event``, ``Stream``, ``stream``, ``current_stream``,
  ``synchronize``, ``CUDAGraph``, ``graph``, ``graph_pool_handle``) with emulations, and of
  ``engine.gpu.kernel`` so a Triton launch checks that every tensor argument is on the device (Triton refuses host
  pointers) and then runs the real kernel under triton's CPU interpreter on the wrapped data.

The graph emulation keeps the CUDA-graph contract: while ``torch.cuda.graph`` captures, ops on
device tensors are recorded (with the Python scalars of that moment baked in, as CUDA bakes
them) and ``CUDAGraph.replay`` re-runs the record on the same tensors, writing results into the
tensors captured as outputs. So a captured forward that read a step value from the host, or made
a device tensor from a Python int that changes per step, gives stale results on replay here as on
a GPU.

What it cannot see: real CUDA concurrency (streams, events and non-blocking copies are executed
in order here, so a missing ``synchronize`` goes unnoticed), memory addresses of the graph pool,
and compiled-Triton-only behaviour (the interpreter runs the kernels).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("cuda", 0)
_CPU = torch.device("cpu")


class HostSyncError(RuntimeError):
    """A host sync (or host<->device copy) inside a region CUDA captures into a graph."""


class DeviceMismatchError(RuntimeError):
    """A host tensor used with device tensors where CUDA refuses it (same message as CUDA's)."""


class GeneratorDeviceError(RuntimeError):
    """A host ``torch.Generator`` passed to an op on device tensors (CUDA refuses it)."""


@dataclass
class _State:
    active: bool = False
    kernels: bool = True  # Triton kernels launched (interpreted); False: the engine's torch paths
    tape: list[Callable[[], None]] | None = None  # recording: ops of the graph being captured
    capturing: bool = False
    launches: dict[str, int] = field(default_factory=dict)  # kernel launches per name (tests)
    captures: int = 0
    replays: int = 0
    # host syncs and blocking host<->device copies (each waits for the GPU's queue to drain); an
    # asynchronous copy to the device (non_blocking) does not wait and is not counted
    syncs: int = 0
    # work the host queues one by one outside a graph replay (each a kernel launch or a copy on a
    # GPU, ~5-10 us of Python and driver apiece): device ops that compute (views excluded),
    # device factories, copies to the device and Triton launches, by name for the diagnostics
    eager: dict[str, int] = field(default_factory=dict)

    @property
    def eager_launches(self) -> int:
        return sum(self.eager.values())


STATE = _State()


# ---- the tensor ---------------------------------------------------------------------------------
class FakeCudaTensor(torch.Tensor):
    """A tensor that says it is on ``cuda:0``; its values live in the CPU tensor ``elem``."""

    elem: torch.Tensor
    __slots__ = ("elem",)

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> FakeCudaTensor:
        if isinstance(elem, FakeCudaTensor) or elem.device.type != "cpu":
            raise TypeError("FakeCudaTensor wraps a CPU tensor")
        t = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=DEVICE, requires_grad=False)
        t.elem = elem
        return t

    # only the dispatch level: a torch function reaching the tensor goes through aten ops
    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:  # the data is real: show it (this is a test helper)
        return f"FakeCudaTensor({self.elem!r})"

    def data_ptr(self) -> int:
        """The host address of the data: stable while the tensor lives (graph keys use it)."""
        return self.elem.data_ptr()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _check(func, args, kwargs)
        if not func.is_view and func not in _SYNCS:
            _launched(str(func.overloadpacket))
        out = _run(func, args, kwargs)
        if STATE.tape is not None:
            STATE.tape.append(_replayer(func, args, kwargs, out))
        return out


_COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default, torch.ops.aten.copy.default,
           torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}
# ops whose index tensors may stay on the host with a device ``self`` (CUDA moves them)
_HOST_INDICES = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
                 torch.ops.aten._index_put_impl_.default}
# ops that make the host wait for the device (illegal while a CUDA graph captures)
_SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.nonzero.default,
          torch.ops.aten.masked_select.default, torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default,
          torch.ops.aten._unique2.default, torch.ops.aten.unique_consecutive.default,
          torch.ops.aten.unique_dim.default, torch.ops.aten.repeat_interleave.Tensor}


def _is_fake(x: Any) -> bool:
    return isinstance(x, FakeCudaTensor)


def _is_host(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not _is_fake(x) and x.device.type == "cpu"


def _launched(name: str) -> None:
    """One kernel launch or copy queued by the host; inside a capture it becomes a graph node."""
    if not STATE.capturing:
        STATE.eager[name] = STATE.eager.get(name, 0) + 1


def _sync(what: str, waits: bool = True) -> None:
    STATE.syncs += waits
    if STATE.capturing:
        raise HostSyncError(f"{what} inside a CUDA-graph capture: the host cannot wait for (or copy to or from) "
                            "the device while a graph is captured")


def _check(func, args: tuple, kwargs: dict) -> None:
    """Raise what CUDA raises for this op on these arguments."""
    if func in _SYNCS:
        _sync(f"{func} (a host sync)")
    gen = kwargs.get("generator")
    if gen is not None and gen.device.type != "cuda":
        raise GeneratorDeviceError(f"Expected a 'cuda' device type for generator but found '{gen.device.type}' "
                                   f"(in {func})")
    if func in _COPIES:
        target = kwargs.get("device")
        crosses = (func is torch.ops.aten._to_copy.default and target is not None and torch.device(target).type
                   == "cpu") or (func is torch.ops.aten.copy_.default and _is_fake(args[0]) != _is_fake(args[1]))
        if crosses:
            _sync(f"{func} between host and device", waits=not _async_upload(func, args))
        return
    skip: list[Any] = []
    if func in _HOST_INDICES:
        skip = [t for t in args[1] if t is not None]  # the index list
        if STATE.capturing and any(t.dtype == torch.bool for t in skip):
            _sync("a boolean-mask index (nonzero)")
    leaves, _ = tree_flatten((args, kwargs))
    for t in leaves:
        if _is_host(t) and t.dim() > 0 and not any(t is s for s in skip):
            raise DeviceMismatchError(f"Expected all tensors to be on the same device, but found at least two "
                                      f"devices, cuda:0 and cpu! (in {func}, a host tensor of shape "
                                      f"{tuple(t.shape)})")


def _unwrap(x: Any) -> Any:
    return x.elem if _is_fake(x) else x


def _run(func, args: tuple, kwargs: dict) -> Any:
    if func is torch.ops.aten._to_copy.default:
        target = kwargs.get("device")
        kw = {**kwargs, "device": _CPU}
        kw.pop("pin_memory", None)
        out = func(_unwrap(args[0]), **kw)
        if target is None or torch.device(target).type == "cuda":
            return FakeCudaTensor(out)
        return out
    if func is torch.ops.aten.copy_.default and not _is_fake(args[0]):  # device -> host copy into a host tensor
        return args[0].copy_(_unwrap(args[1]))
    u_args, u_kwargs = tree_map(_unwrap, args), tree_map(_unwrap, kwargs)
    if "device" in u_kwargs and u_kwargs["device"] is not None:
        u_kwargs["device"] = _CPU
        u_kwargs.pop("pin_memory", None)
    out = func(*u_args, **u_kwargs)
    # an op that returns one of its arguments (in place, ``out=``) returns that very wrapper
    originals = {id(_unwrap(a)): a for a in tree_flatten((args, kwargs))[0] if _is_fake(a)}

    def wrap(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or _is_fake(x):
            return x
        return originals[id(x)] if id(x) in originals else FakeCudaTensor(x)

    return tree_map(wrap, out)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _replayer(func, args: tuple, kwargs: dict, out: Any) -> Callable[[], None]:
    """The op as a captured graph node: re-run on the same tensors (their values then), with the
    Python scalars of capture time, writing into the captured outputs' memory. Results that are
    that memory already (in-place ops, views) need no copy; the schema cannot tell (``aten.to``
    says it may alias and makes a copy when the dtype changes), so the storage decides."""

    def replay() -> None:
        fresh = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        for old, new in zip(tree_flatten(out)[0], tree_flatten(fresh)[0], strict=True):
            if _is_fake(old) and not _same_memory(old.elem, new):
                old.elem.copy_(new)

    return replay


# ---- factories and copies that name the device --------------------------------------------------
def _names_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True  # an ordinal means a CUDA device in torch's arguments
    return torch.device(device).type == "cuda"


def _pinned(t: torch.Tensor) -> bool:
    """Pinned host memory, or a view of it (a slice of a pinned buffer is pinned too)."""
    return bool(getattr(t, "_fake_pinned", False) or getattr(t._base, "_fake_pinned", False))


def _async_upload(func, args: tuple) -> bool:
    """``device.copy_(pinned host, non_blocking=True)``: queued, the host does not wait (from
    pageable memory CUDA stages the copy and the host waits)."""
    return (func is torch.ops.aten.copy_.default and _is_fake(args[0]) and len(args) > 2 and bool(args[2])
            and _pinned(args[1]))


def _mark_pinned(t: torch.Tensor) -> torch.Tensor:
    t._fake_pinned = True  # type: ignore[attr-defined]
    return t


_HOST_READS: dict[Any, str] = {
    torch.Tensor.tolist: ".tolist()", torch.Tensor.item: ".item()", torch.Tensor.__int__: "int(t)",
    torch.Tensor.__float__: "float(t)", torch.Tensor.__bool__: "bool(t)", torch.Tensor.__index__: "an index",
    torch.Tensor.numpy: ".numpy()", torch.Tensor.cpu: ".cpu()",
}


def _contiguous(t: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    if t.is_contiguous(memory_format=memory_format):
        return t
    return torch.ops.aten.clone.default(t, memory_format=memory_format)


def _new_tensor(t: torch.Tensor, data: Any, dtype: torch.dtype | None = None, device: Any = None,
                requires_grad: bool = False) -> torch.Tensor:
    host = torch.tensor(data, dtype=dtype or t.dtype)
    return host if device is not None and not _names_cuda(device) else FakeCudaTensor(host)


# Tensor methods whose Python bindings open a device guard in C++ (absent for CUDA on a CPU-only
# build): sent straight to the aten op, i.e. to FakeCudaTensor.__torch_dispatch__ and its checks.
_GUARDED: dict[Any, Callable[..., Any]] = {
    torch.Tensor.copy_: lambda t, src, non_blocking=False: torch.ops.aten.copy_.default(t, src, non_blocking),
    torch.Tensor.contiguous: _contiguous,
    torch.Tensor.nonzero: lambda t, *, as_tuple=False: (torch.ops.aten.nonzero.default(t) if not as_tuple
                                                        else torch.ops.aten.nonzero.default(t).unbind(1)),
    torch.Tensor.new_tensor: _new_tensor,
    torch.Tensor.__invert__: lambda t: torch.ops.aten.bitwise_not.default(t),
}


# torch functions whose C++ builds device tensors of its own (sdpa's causal or boolean mask), which
# a CPU-only build cannot: run on the host data behind the wrappers, after CUDA's checks
_HOST_COMPOSITES = {torch.nn.functional.scaled_dot_product_attention}


def _composite(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    _check(func, args, kwargs)
    _launched(getattr(func, "__name__", str(func)))
    out = tree_map(lambda x: FakeCudaTensor(x) if isinstance(x, torch.Tensor) else x,
                   func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs)))
    if STATE.tape is not None:  # inside a capture: a graph node
        STATE.tape.append(_replayer(func, args, kwargs, out))
    return out


class FakeCudaMode(TorchFunctionMode):
    """Rewrites every torch call that names ``cuda`` into a CPU call whose result is wrapped."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _HOST_READS and args and _is_fake(args[0]):
            _sync(f"{_HOST_READS[func]} of a device tensor")
            elem = args[0].elem
            return elem.clone() if func is torch.Tensor.cpu else func(elem, *args[1:], **kwargs)
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _is_fake(args[0]):
            return _index(func, *args)
        if func in _GUARDED and any(_is_fake(a) for a in args):
            return _GUARDED[func](*args, **kwargs)
        if func in _HOST_COMPOSITES and any(_is_fake(a) for a in args):
            return _composite(func, args, kwargs)
        if func is torch.Tensor.cuda:
            return self._to_device(args[0], DEVICE, None, kwargs.get("non_blocking", False))
        if func is torch.Tensor.to:
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if args[1:] and isinstance(args[1], torch.Tensor):  # t.to(other): other's device and dtype
                device, dtype = args[1].device, args[1].dtype
            if device is not None and (_names_cuda(device) or _is_fake(args[0])):
                return self._to_device(args[0], device, dtype, non_blocking)
            return func(*args, **kwargs)
        if func is torch.Tensor.pin_memory:
            return _mark_pinned(args[0].clone())
        if func is torch.Tensor.is_pinned:
            return _pinned(args[0])
        if _names_cuda(kwargs.get("device")):
            gen = kwargs.get("generator")
            if gen is not None and gen.device.type != "cuda":
                raise GeneratorDeviceError(f"Expected a 'cuda' device type for generator but found "
                                           f"'{gen.device.type}' (in {getattr(func, '__name__', func)})")
            if func in (torch.tensor, torch.as_tensor, torch.asarray):
                _sync(f"{func.__name__}(host data, device=cuda) (a host-to-device copy)")
            kwargs["device"] = _CPU
            kwargs.pop("pin_memory", None)
            out = FakeCudaTensor(func(*args, **kwargs))
            _launched(getattr(func, "__name__", str(func)))
            if STATE.tape is not None:  # a device factory inside a capture: a graph node too
                STATE.tape.append(_factory_replayer(func, args, kwargs, out))
            return out
        if kwargs.pop("pin_memory", False):
            return _mark_pinned(func(*args, **kwargs))
        return func(*args, **kwargs)

    @staticmethod
    def _to_device(t: torch.Tensor, device: Any, dtype: torch.dtype | None, non_blocking: bool) -> torch.Tensor:
        to_cuda = _names_cuda(device)
        if _is_fake(t) == to_cuda:  # no device change: the op, without copying when nothing changes
            elem = t.elem if _is_fake(t) else t
            out = elem.to(dtype) if dtype is not None else elem
            return t if out is elem else (FakeCudaTensor(out) if to_cuda else out)
        _sync("a copy " + ("to the device" if to_cuda else "to the host"), waits=not (to_cuda and non_blocking))
        if to_cuda:
            _launched("copy to the device")
            return FakeCudaTensor(t.to(_CPU, dtype, copy=True))
        return t.elem.to(_CPU, dtype, copy=True)


def _index(func, t: FakeCudaTensor, index: Any, value: Any = None) -> Any:
    """``t[index]`` and ``t[index] = value`` on a device tensor. Python indexing opens a CUDA device
    guard in C++ (which a CPU-only build has not got), so it runs here on the host data with CUDA's
    rules: index tensors may be on the host (CUDA copies them over, which a capture forbids), an
    assigned value may come from the host through a slice (a copy) but not through an index tensor."""
    flat = tree_flatten(index)[0] if isinstance(index, (tuple, list)) else [index]
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    if any(x.dtype == torch.bool for x in tensors):
        _sync("a boolean-mask index (nonzero)")
    if any(_is_host(x) and x.dim() > 0 for x in tensors):
        _sync("a host index tensor (copied to the device)")
    u_index = tuple(_unwrap(x) for x in index) if isinstance(index, tuple) else _unwrap(index)
    if func is torch.Tensor.__getitem__:
        out = t.elem[u_index]
        wrapped = FakeCudaTensor(out)
        if not _same_memory(out, t.elem):
            _launched("gather (t[index])")
        if STATE.tape is not None and not _same_memory(out, t.elem):  # a gather: a graph node
            STATE.tape.append(lambda: wrapped.elem.copy_(t.elem[u_index]))
        return wrapped
    if _is_host(value) and value.dim() > 0:
        if tensors:
            raise DeviceMismatchError("Expected all tensors to be on the same device, but found at least two "
                                      "devices, cuda:0 and cpu! (index_put_ of a host value)")
        _sync("a host-to-device copy (assignment of a host tensor)")
    u_value = _unwrap(value)
    _launched("scatter (t[index] = value)")
    t.elem[u_index] = u_value
    if STATE.tape is not None:
        STATE.tape.append(lambda: t.elem.__setitem__(u_index, u_value))
    return None


def _factory_replayer(func, args: tuple, kwargs: dict, out: FakeCudaTensor) -> Callable[[], None]:
    def replay() -> None:
        out.elem.copy_(func(*args, **kwargs))

    return replay


# ---- torch.cuda stand-ins ---------------------------------------------------------------------------
class _Event:
    """torch.cuda.Event: work is in order here, so recording is a no-op; waiting on one is a sync."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        _sync("torch.cuda.Event.synchronize()")

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    """torch.cuda.Stream: one in-order stream in effect."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        _sync("torch.cuda.Stream.synchronize()")


def _synchronize(device: Any = None) -> None:
    """torch.cuda.synchronize: the host waits for the device (a timing's end, the warm-up's)."""
    _sync("torch.cuda.synchronize()")


class _CUDAGraph:
    """torch.cuda.CUDAGraph: the ops recorded while captured, re-run by :meth:`replay`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.nodes: list[Callable[[], None]] = []

    def replay(self) -> None:
        if not self.nodes:
            raise RuntimeError("replay of a graph that captured nothing")
        for node in self.nodes:
            node()
        STATE.replays += 1


@contextlib.contextmanager
def _graph(graph: _CUDAGraph, pool: Any = None, stream: Any = None, **kwargs: Any) -> Iterator[None]:
    """torch.cuda.graph: record the device ops of the block into ``graph``; host syncs raise."""
    if STATE.capturing:
        raise RuntimeError("nested CUDA-graph capture")
    STATE.capturing, STATE.tape = True, []
    try:
        yield
        graph.nodes = STATE.tape
        STATE.captures += 1
    finally:
        STATE.capturing, STATE.tape = False, None


@contextlib.contextmanager
def capture_region() -> Iterator[None]:
    """Mark a block as captured (host syncs raise) without recording it: for regression tests."""
    with _graph(_CUDAGraph()):
        yield


# ---- Triton launches ----------------------------------------------------------------------------------
class _Launcher:
    """``kernel[grid]``: checks that every tensor argument is on the device, then runs the real
    kernel under triton's interpreter on the host data behind the wrappers."""

    def __init__(self, name: str, kernel: Any) -> None:
        self.name = name
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            for i, a in enumerate(args):
                if _is_host(a):
                    # triton's own words for a host pointer handed to a GPU kernel
                    raise ValueError(f"Pointer argument (at {i}) cannot be accessed from Triton (cpu tensor?) "
                                     f"in kernel {self.name}")
            STATE.launches[self.name] = STATE.launches.get(self.name, 0) + 1
            _launched(f"triton {self.name}")
            self.kernel[grid](*(_unwrap(a) for a in args), **kwargs)
            if STATE.tape is not None:  # a launch inside a capture is a graph node
                STATE.tape.append(lambda: self.kernel[grid](*(_unwrap(a) for a in args), **kwargs))

        return launch


def _kernel_patch(original: Callable[[str, Callable[[], Any]], Any]) -> Callable[[str, Callable[[], Any]], Any]:
    def kernel(name: str, build: Callable[[], Any]) -> Any:
        built = original(name, build)
        if isinstance(built, dict):
            return {k: _Launcher(f"{name}.{k}", v) for k, v in built.items()}
        return _Launcher(name, built)

    return kernel


def _no_grad_enter(self: Any) -> None:
    self._inference_mode_context = torch.no_grad() if self.mode else contextlib.nullcontext()
    self._inference_mode_context.__enter__()


@contextlib.contextmanager
def fake_cuda(monkeypatch: Any, *, kernels: bool = True) -> Iterator[_State]:
    """Everything the engine does on ``cuda`` runs here on claimed device tensors (see the module
    docstring). ``kernels``: launch the Triton kernels (interpreted; needs triton imported in
    interpreter mode, which tests/gpu/conftest.py arranges); False hides triton from the engine,
    which then takes its torch paths, as on a GPU machine without triton."""
    import engine.gpu

    global STATE
    STATE = _State(active=True, kernels=kernels)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _CUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", _graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "synchronize", _synchronize)
    # inference mode cannot version a wrapper subclass made inside it ("Cannot set version_counter for
    # inference tensor": the Medusa heads' logits run under it); it only spares autograd's
    # bookkeeping, so no_grad computes the same values here
    grad_mode = torch.autograd.grad_mode.inference_mode
    monkeypatch.setattr(grad_mode, "__enter__", _no_grad_enter)
    monkeypatch.setattr(grad_mode, "__exit__", lambda self, *exc: self._inference_mode_context.__exit__(*exc))
    if kernels:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(engine.gpu, "kernel", _kernel_patch(engine.gpu.kernel))
    else:
        monkeypatch.setattr(engine.gpu, "triton_available", lambda: False)
    try:
        with FakeCudaMode():
            yield STATE
    finally:
        STATE.active = False
