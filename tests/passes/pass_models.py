"""Small models lowered to StableHLO the way the backend does, and two
executors (XLA CPU through jaxlib, the StableHLO reference interpreter) for
the numeric tests of the passes."""
from __future__ import annotations

import numpy as np
import torch
import torch_mlir.fx as tfx
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch_mlir import ir, passmanager
from torch_mlir._mlir_libs import _stablehlo
from torch_mlir._mlir_libs import _torchMlir  # noqa: F401  (registers passes)
from torch_mlir.extras.fx_decomp_util import get_decomposition_table

TABLE = dict(core_aten_decompositions())
TABLE.update(get_decomposition_table())
CLEANUP = "builtin.module(func.func(stablehlo-aggressive-simplification),canonicalize)"


def lower(fn, *args) -> str:
    """fn(*tensors) -> StableHLO text of @main, as the backend hands it over."""
    gm = make_fx(fn, decomposition_table=TABLE)(*args)
    m = tfx.stateless_fx_import(gm, output_type="stablehlo")
    with m.context:
        _stablehlo.register_stablehlo_passes()
        passmanager.PassManager.parse(CLEANUP).run(m.operation)
    return str(m)


# --------------------------------------------------------------- models


def mlp(w1, b1, w2, b2, x):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
    return torch.nn.functional.linear(h, w2, b2)


def attention(q, k, v, mask):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5) + mask
    return torch.softmax(s, -1) @ v


def layer_norm(w, b, x):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def rms_norm(w, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def conv(w, b, x):
    return torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1))


def causal_mask(t: int) -> torch.Tensor:
    return torch.full((t, t), -1e9).triu(1).reshape(1, 1, t, t)


def example(name: str, seed: int = 0):
    """(fn, inputs) of a named test model, with odd sizes that need padding."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    if name == "mlp":
        return mlp, [r(200, 96) * 0.1, r(200), r(40, 200) * 0.1, r(40), r(12, 96)]
    if name == "attention":
        return attention, [r(2, 3, 20, 48), r(2, 3, 20, 48), r(2, 3, 20, 48), causal_mask(20)]
    if name == "layer_norm":
        return layer_norm, [r(72), r(72), r(4, 10, 72)]
    if name == "rms_norm":
        return rms_norm, [r(72), r(4, 10, 72)]
    if name == "conv":
        return conv, [r(12, 5, 3, 3) * 0.2, r(12), r(2, 5, 9, 9)]
    raise KeyError(name)


MODELS = ("mlp", "attention", "layer_norm", "rms_norm", "conv")


def lowered(name: str):
    fn, inputs = example(name)
    return lower(fn, *inputs), [t.numpy() for t in inputs], fn(*inputs).numpy()


# --------------------------------------------------------------- executors


def to_device(arrays: list[np.ndarray]) -> list:
    """numpy -> jax arrays keeping int64 (jax would narrow it to int32 and the
    executable, compiled for s64, would reject it), without flipping the
    process-wide x64 flag."""
    import jax

    with jax.enable_x64(True):
        return [jax.device_put(x) for x in arrays]


def run_xla(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import jax
    from jax._src.lib import xla_client
    from jax.extend.backend import get_backend

    client = get_backend("cpu")
    devices = xla_client.DeviceList(tuple(client.local_devices()[:1]))
    exe = client.compile_and_load(text, devices, xla_client.CompileOptions())
    outs = exe.execute_sharded(to_device(inputs))
    return [np.array(o[0]) for o in outs.disassemble_into_single_device_arrays()]


def run_interpreter(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The reference interpreter aborts the process (LLVM ERROR) on
    `arith.constant`, so those become the equal `stablehlo.constant` first."""
    from neuron_compile.passes.canonicalize import arith_constants_to_stablehlo

    ctx = ir.Context()
    _stablehlo.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        arith_constants_to_stablehlo(module)
        args = [ir.DenseElementsAttr.get(np.asarray(x, order="C")) for x in inputs]  # 0-d stays 0-d
        results = _stablehlo.eval_module(module, args)
        return [np.array(r) for r in results]
