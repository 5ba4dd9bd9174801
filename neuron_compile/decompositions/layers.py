"""Layers, optimizers and library ops: what a training step meets beyond single ATen ops.

convolution_backward (each gradient written as a forward convolution:
torch-mlir lowers the backward only for plain 2-D convolutions), weight_norm's
backward, ``nn.TransformerEncoder``'s fused inference fast path written out as
the layer's algebra, the fused LSTM and GRU cells ATen calls off the CPU (and
their backwards), every ``torch._foreach_*`` op (gradient clipping,
``foreach=True`` optimizers) as its per-tensor op, and the custom ops that
libraries register once loaded (``_library_decompositions``: Inductor's
``prims.fma`` from ``addcmul_``/``addcdiv_``, transformers' grouped_mm for MoE
layers), which the table picks up each time it is asked for.
"""

from __future__ import annotations

import math

import torch

from .core import _arange, _ours

aten = torch.ops.aten


@_ours(aten.convolution_backward)
def _convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    # torch-mlir lowers the convolution backward only for 2-D, ungrouped, undilated, untransposed
    # convolutions: training Conv1d/Conv3d, depthwise or dilated convolutions and ConvTranspose
    # failed. Each gradient is a forward convolution instead, which it lowers in general:
    # the input's is the adjoint convolution (transposed <-> not), the weight's correlates the
    # input with the output gradient, batch folded into channels, group by group.
    spatial = x.dim() - 2
    grad_x = grad_w = grad_b = None
    if output_mask[0]:
        if transposed:
            grad_x = aten.convolution.default(grad, weight, None, stride, padding, dilation, False,
                                              [0] * spatial, groups)
            for i in range(spatial):  # an output padding of a stride or more (dilation allows it) adds rows
                grad_x = aten.slice.Tensor(grad_x, 2 + i, 0, x.shape[2 + i])
        else:  # the output padding that gives back the input's size
            extra = [x.shape[2 + i] - ((grad.shape[2 + i] - 1) * stride[i] - 2 * padding[i]
                                       + dilation[i] * (weight.shape[2 + i] - 1) + 1) for i in range(spatial)]
            grad_x = aten.convolution.default(grad, weight, None, stride, padding, dilation, True, extra, groups)
    if output_mask[1]:
        # non-transposed: grad_w[g*Co + o, c, k] = sum_n,j x[n, g*Ci + c, j*s + k*d - p] * grad[n, g*Co + o, j];
        # transposed: the same with x and grad swapped. A convolution of `signal` by `kernel`, stride
        # and dilation exchanged, over [channels, groups*batch, ...] and [groups*channels, batch, ...].
        signal, kernel = (grad, x) if transposed else (x, grad)
        batch = x.shape[0]

        def by_group(t, as_signal):  # [N, G*C, ...] -> [C, G*N, ...] (signal) or [G*C, N, ...] (kernel)
            c = t.shape[1] // groups
            t = aten.view.default(t, [batch, groups, c, *t.shape[2:]])
            if as_signal:
                return aten.reshape.default(aten.permute.default(t, [2, 1, 0, *range(3, 3 + spatial)]),
                                            [c, groups * batch, *t.shape[3:]])
            return aten.reshape.default(aten.permute.default(t, [1, 2, 0, *range(3, 3 + spatial)]),
                                        [groups * c, batch, *t.shape[3:]])

        w = aten.convolution.default(by_group(signal, True), by_group(kernel, False), None, dilation, padding,
                                     stride, False, [0] * spatial, groups)
        for i in range(spatial):  # the correlation can run past the kernel's size
            w = aten.slice.Tensor(w, 2 + i, 0, weight.shape[2 + i])
        # [Ci, G*Co, ...] -> [G*Co, Ci, ...]; transposed: [Co, G*Ci, ...] -> [G*Ci, Co, ...], the weight's layout
        grad_w = aten.permute.default(w, [1, 0, *range(2, 2 + spatial)])
    if output_mask[2]:
        grad_b = aten.sum.dim_IntList(grad, [0, *range(2, 2 + spatial)])
    return grad_x, grad_w, grad_b


@_ours(aten.hardshrink_backward)
@_ours(aten.softshrink_backward)
def _shrink_backward(grad: torch.Tensor, x: torch.Tensor, lambd):
    # both pass the gradient where |x| > lambd and stop it elsewhere (an eager backward op on the
    # neuron device: compiled graphs see the autograd formula instead)
    return aten.where.self(aten.gt.Scalar(aten.abs.default(x), lambd), grad, aten.zeros_like.default(grad))


@_ours(aten._weight_norm_interface_backward)
def _weight_norm_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    # Training through weight_norm (audio models' convolutions, wav2vec2's positional conv) reaches
    # this opaque backward; torch-mlir lowers the forward's decomposition but not it. ATen's
    # _weight_norm_differentiable_backward: w = g * v / ||v||, norms taken over every dim but `dim`.
    dim = dim % saved_v.dim()
    others = [d for d in range(saved_v.dim()) if d != dim]
    sums = aten.sum.dim_IntList(aten.mul.Tensor(grad_w, saved_v), others, True)
    grad_v = aten.mul.Tensor(aten.div.Tensor(saved_g, saved_norms), aten.sub.Tensor(
        grad_w, aten.mul.Tensor(saved_v, aten.div.Tensor(sums, aten.mul.Tensor(saved_norms, saved_norms)))))
    grad_g = aten.div.Tensor(sums, saved_norms)
    return aten._to_copy.default(grad_v, dtype=saved_v.dtype), aten._to_copy.default(grad_g, dtype=saved_g.dtype)


@_ours(aten._transformer_encoder_layer_fwd)
def _transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                               norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                               ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    # nn.TransformerEncoderLayer's fast path (eval mode, no grad) is this one fused ATen op, which
    # torch-mlir does not lower: the layer's own algebra (ATen's transformer_encoder_layer_forward)
    def norm(x, weight, bias):
        return aten.native_layer_norm.default(x, [embed_dim], weight, bias, eps)[0]

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = aten.add.Tensor(_self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                                        mask_type), src)
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = aten.linear.default(h, ffn_weight_1, ffn_bias_1)
    h = aten.gelu.default(h) if use_gelu else aten.relu.default(h)
    x = aten.add.Tensor(aten.linear.default(h, ffn_weight_2, ffn_bias_2), residual)
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def _self_attention(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    # ATen's native multi-head attention on [B, L, D]. Masks as merge_masks builds them: type 0
    # [L, L], type 1 key padding [B, L], type 2 [B, H or 1, L, L]; bool masks hide True, float
    # masks add. A row with every key hidden is zero, as ATen's masked softmax makes it.
    batch, length, dim = x.shape
    head = dim // num_heads

    def heads(t):  # [B, L, D] -> [B, H, L, head]
        return aten.permute.default(aten.view.default(t, [batch, length, num_heads, head]), [0, 2, 1, 3])

    q, k, v = (heads(t) for t in aten.split.Tensor(aten.linear.default(x, qkv_weight, qkv_bias), dim, -1))
    scores = aten.matmul.default(aten.mul.Tensor(q, 1.0 / math.sqrt(head)), aten.transpose.int(k, -2, -1))
    if mask is not None:
        shape = {0: [1, 1, length, length], 1: [batch, 1, 1, length]}.get(mask_type)
        mask = aten.view.default(mask, shape) if shape is not None else mask
        if mask.dtype == torch.bool:
            scores = aten.masked_fill.Scalar(scores, mask, float("-inf"))
        else:
            scores = aten.add.Tensor(scores, mask)
    probs = aten._softmax.default(scores, -1, False)
    if mask is not None:
        probs = aten.where.self(aten.isnan.default(probs), aten.zeros_like.default(probs), probs)
    context = aten.permute.default(aten.matmul.default(probs, v), [0, 2, 1, 3])
    return aten.linear.default(aten.reshape.default(context, [batch, length, dim]), proj_weight, proj_bias)


# ---- recurrent cells: nn.LSTM / nn.GRU on a device that is not the CPU ------------------------------
# ATen's LSTM and GRU cells call the fused cell kernels for any input that is not on the CPU (CUDA's,
# which have no CPU kernel: aten/src/ATen/native/cuda/RNN.cu); autograd's backward for them are the
# fused backward kernels. Written out here with the CUDA kernels' gate order and workspaces: LSTM gates
# i, f, g, o and a workspace of the four activated gates; GRU gates r, z, n and a workspace of
# r, z, n, hx and the hidden n gate with its bias.

def _gates(input_gates, hidden_gates, input_bias, hidden_bias, count):
    gates = aten.add.Tensor(input_gates, hidden_gates)
    if input_bias is not None:
        gates = aten.add.Tensor(gates, aten.add.Tensor(input_bias, hidden_bias))
    return aten.split.Tensor(gates, gates.shape[1] // count, 1)


@_ours(aten._thnn_fused_lstm_cell)
def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 4)
    i, f, g, o = aten.sigmoid.default(i), aten.sigmoid.default(f), aten.tanh.default(g), aten.sigmoid.default(o)
    cy = aten.add.Tensor(aten.mul.Tensor(f, cx), aten.mul.Tensor(i, g))
    hy = aten.mul.Tensor(o, aten.tanh.default(cy))
    return hy, cy, aten.cat.default([i, f, g, o], 1)


@_ours(aten._thnn_fused_lstm_cell_backward_impl)
def _fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = aten.split.Tensor(workspace, workspace.shape[1] // 4, 1)
    tanh_cy = aten.tanh.default(cy)
    grad_o = aten.mul.Tensor(grad_hy, tanh_cy) if grad_hy is not None else aten.zeros_like.default(cy)
    grad_c = (aten.mul.Tensor(aten.mul.Tensor(grad_hy, o), aten.rsub.Scalar(aten.mul.Tensor(tanh_cy, tanh_cy), 1))
              if grad_hy is not None else aten.zeros_like.default(cy))
    if grad_cy is not None:
        grad_c = aten.add.Tensor(grad_c, grad_cy)

    def through_sigmoid(grad, gate):
        return aten.mul.Tensor(aten.mul.Tensor(grad, aten.rsub.Scalar(gate, 1)), gate)

    grad_gates = aten.cat.default([
        through_sigmoid(aten.mul.Tensor(grad_c, g), i),
        through_sigmoid(aten.mul.Tensor(grad_c, cx), f),
        aten.mul.Tensor(aten.mul.Tensor(grad_c, i), aten.rsub.Scalar(aten.mul.Tensor(g, g), 1)),
        through_sigmoid(grad_o, o)], 1)
    grad_bias = aten.sum.dim_IntList(grad_gates, [0]) if has_bias else None
    return grad_gates, aten.mul.Tensor(grad_c, f), grad_bias


@_ours(aten._thnn_fused_gru_cell)
def _fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = aten.add.Tensor(input_gates, input_bias)
        hidden_gates = aten.add.Tensor(hidden_gates, hidden_bias)
    size = hx.shape[1]
    in_r, in_z, in_n = aten.split.Tensor(input_gates, size, 1)
    hid_r, hid_z, hid_n = aten.split.Tensor(hidden_gates, size, 1)
    r = aten.sigmoid.default(aten.add.Tensor(in_r, hid_r))
    z = aten.sigmoid.default(aten.add.Tensor(in_z, hid_z))
    n = aten.tanh.default(aten.add.Tensor(in_n, aten.mul.Tensor(r, hid_n)))
    hy = aten.add.Tensor(n, aten.mul.Tensor(z, aten.sub.Tensor(hx, n)))
    return hy, aten.cat.default([r, z, n, hx, hid_n], 1)


@_ours(aten._thnn_fused_gru_cell_backward)
def _fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hid_n = aten.split.Tensor(workspace, workspace.shape[1] // 5, 1)
    grad_z = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(grad_hy, aten.sub.Tensor(hx, n)),
                                             aten.rsub.Scalar(z, 1)), z)
    grad_in_n = aten.mul.Tensor(aten.mul.Tensor(grad_hy, aten.rsub.Scalar(z, 1)),
                                aten.rsub.Scalar(aten.mul.Tensor(n, n), 1))
    grad_r = aten.mul.Tensor(aten.mul.Tensor(aten.mul.Tensor(grad_in_n, hid_n), aten.rsub.Scalar(r, 1)), r)
    grad_input_gates = aten.cat.default([grad_r, grad_z, grad_in_n], 1)
    grad_hidden_gates = aten.cat.default([grad_r, grad_z, aten.mul.Tensor(grad_in_n, r)], 1)
    grad_hx = aten.mul.Tensor(grad_hy, z)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return (grad_input_gates, grad_hidden_gates, grad_hx, aten.sum.dim_IntList(grad_input_gates, [0]),
            aten.sum.dim_IntList(grad_hidden_gates, [0]))


# ---- torch._foreach_*: one op over a list of tensors ----------------------------------------------
# torch-mlir lowers none of them. They come from torch.nn.utils.clip_grad_norm_ (_foreach_norm,
# _foreach_mul_), optimizers built with foreach=True and user code. Each becomes its per-tensor op,
# list arguments taken element by element; XLA fuses the result as it would the loop.

def _addc(combine):
    def per_tensor(x, t1, t2, value=1):
        return aten.add.Tensor(x, aten.mul.Tensor(combine(t1, t2), value))
    return per_tensor


_FOREACH_PER_TENSOR = {
    # per-tensor ops whose call differs from the foreach one
    "addcmul": _addc(aten.mul.Tensor),  # foreach passes value positionally (and as a tensor element)
    "addcdiv": _addc(aten.div.Tensor),
    "norm": lambda x, ord=2, dtype=None: aten.linalg_vector_norm.default(x, ord, dtype=dtype),
    "powsum": lambda x, ord=2, dtype=None: aten.sum.default(aten.pow.Tensor_Scalar(aten.abs.default(x), ord),
                                                            dtype=dtype),
}


def _foreach(name: str, overload):
    """The decomposition of ``aten._foreach_<name>.<overload>``: the per-tensor op, element by element."""
    schema = overload._schema
    # arguments taken element by element: every list, and the per-element scalars of addcmul/addcdiv.Tensor
    listed = [str(a.type).startswith("List[") or (a.name == "scalars" and str(a.type) == "Tensor")
              for a in schema.arguments if not a.kwarg_only]
    per_tensor = _FOREACH_PER_TENSOR.get(name)
    if per_tensor is None:
        packet = getattr(aten, name)
        if name in ("maximum", "minimum") and overload._overloadname in ("Scalar", "ScalarList"):
            packet = aten.clamp_min if name == "maximum" else aten.clamp_max  # no Scalar overload
        per_tensor = packet

    def decomposition(*args, **kwargs):
        count = len(next(a for a, is_list in zip(args, listed) if is_list))
        return [per_tensor(*(a[i] if is_list else a for a, is_list in zip(args, listed)), **kwargs)
                for i in range(count)]
    return decomposition


def _foreach_decompositions() -> dict:
    table = {}
    for qualified in torch._C._dispatch_get_all_op_names():  # 4 ms; every schema parsed would be 12
        name, _, overload_name = qualified.removeprefix("aten::").partition(".")
        if not qualified.startswith("aten::_foreach_") or name.endswith("_") or overload_name.endswith("out"):
            continue  # in-place and out= forms are functionalized before they reach us
        overload = getattr(getattr(aten, name), overload_name or "default")
        table[overload] = _foreach(name[len("_foreach_"):], overload)
    return table


def _group_of_rows(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """Expert of each row for cumulative group ends ``offs``: the number of ends <= row (E: past the last)."""
    row = aten.arange.start_step(0, rows, 1, dtype=offs.dtype, device=offs.device)
    return aten.sum.dim_IntList(aten._to_copy.default(aten.ge.Tensor(aten.unsqueeze.default(row, 1),
                                                                     aten.unsqueeze.default(offs, 0)),
                                                      dtype=torch.int64), [1])


def _grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    # transformers' MoE layers (mixtral, qwen3_moe, olmoe, granitemoe, gpt_oss...) call the
    # opaque custom op transformers::grouped_mm_fallback, a Python loop over experts.
    # Every expert on every row, then each row picks its own expert's result (rows past
    # the last offset stay zero, as in the loop).
    rows, experts = x.shape[0], weight.shape[0]
    group = _group_of_rows(offs, rows)
    every = aten.matmul.default(x, weight)  # [E, S, N]
    picked = aten.index.Tensor(every, [aten.clamp_max.default(group, experts - 1), _arange(rows, x)])
    return aten.mul.Tensor(picked, aten.unsqueeze.default(aten.lt.Scalar(group, experts), 1))


def _grouped_mm_backward(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, grad: torch.Tensor):
    # The backward custom op of the same loop: grad_input rows use their expert's weight,
    # grad_weight[e] sums x^T grad over expert e's rows (a one-hot mask per expert).
    rows, experts = x.shape[0], weight.shape[0]
    group = _group_of_rows(offs, rows)
    grad_input = _grouped_mm(grad, aten.transpose.int(weight, 1, 2), offs)
    mask = aten._to_copy.default(aten.eq.Tensor(aten.unsqueeze.default(_arange(experts, x), 1),
                                                aten.unsqueeze.default(group, 0)), dtype=x.dtype)  # [E, S]
    masked = aten.mul.Tensor(aten.unsqueeze.default(mask, 2), aten.unsqueeze.default(x, 0))  # [E, S, K]
    grad_weight = aten.matmul.default(aten.transpose.int(masked, 1, 2), grad)  # [E, K, N]
    return grad_input, grad_weight


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    # Dynamo itself rewrites addcmul_(t1, t2, value=v), addcdiv_ and add_(other, alpha=tensor)
    # into Inductor's prims.fma (every compiled Adam/AdamW step), which torch-mlir does not know.
    # StableHLO has no fused multiply-add: a * b + c, which XLA's CPU code may fuse again.
    return aten.add.Tensor(aten.mul.Tensor(a, b), c)


def _library_decompositions():
    """Decompositions of custom ops that libraries register (only once they are loaded)."""
    found = []
    fma = getattr(torch.ops.prims, "fma", None)  # registered by torch._inductor.inductor_prims
    if fma is not None:
        found.append((fma.default, _fma))
    transformers_ops = getattr(torch.ops, "transformers", None)
    for name, fn in (("grouped_mm_fallback", _grouped_mm), ("grouped_mm_fallback_backward", _grouped_mm_backward)):
        try:
            found.append((getattr(transformers_ops, name).default, fn))
        except (AttributeError, RuntimeError):
            pass
    from .flex_attention import library_decompositions as flex_attention_ops

    found.extend(flex_attention_ops())
    return found
